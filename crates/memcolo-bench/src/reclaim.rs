//! `memcolo bench reclaim`: the asynchronous-reclaim comparison (Hermit, NSDI'23).
//!
//! By default the colocation sweep ([`crate::colocation::run`]) with the reclaim
//! comparison's modes (kernel, watermarks, fixed, reclaim) and levels (0, 100, 125,
//! 150 %), into `bench/out/reclaim/...`; with `--batch`, Hermit's batch experiment
//! ([`crate::batch::run`]). Options given explicitly win.

use std::path::Path;

use crate::colocation::{ColocationArgs, Mode};
use crate::harness::default_out_dir;
use crate::lc::LcKind;

/// Runs the experiment `args` asks for.
pub fn run(args: &ColocationArgs, memcolo_exe: &Path) -> anyhow::Result<()> {
    if args.batch {
        return crate::batch::run(args, memcolo_exe);
    }
    crate::colocation::run(&with_defaults(args), memcolo_exe)
}

/// `args` with the reclaim comparison's defaults where nothing was given.
pub fn with_defaults(args: &ColocationArgs) -> ColocationArgs {
    let mut a = args.clone();
    a.modes
        .get_or_insert_with(|| vec![Mode::Kernel, Mode::Watermarks, Mode::Fixed, Mode::Reclaim]);
    a.levels.get_or_insert_with(|| vec![0, 100, 125, 150]);
    if a.out.is_none() {
        a.out = Some(default_out_dir(match a.lc {
            LcKind::Redis => "reclaim",
            LcKind::Memcached => "reclaim-memcached",
        }));
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::colocation::tests::parse;

    #[test]
    fn reclaim_defaults_fill_only_what_was_not_given() {
        let a = with_defaults(&parse(&["--quick"]));
        assert_eq!(
            a.modes.unwrap(),
            vec![Mode::Kernel, Mode::Watermarks, Mode::Fixed, Mode::Reclaim]
        );
        assert_eq!(a.levels.unwrap(), vec![0, 100, 125, 150]);
        assert!(a.out.unwrap().starts_with("bench/out/reclaim"));
        let a = with_defaults(&parse(&["--modes", "kernel", "--levels", "50"]));
        assert_eq!(a.modes.unwrap(), vec![Mode::Kernel]);
        assert_eq!(a.levels.unwrap(), vec![50]);
    }
}
