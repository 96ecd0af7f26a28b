//! The workspace's layering, checked on its sources.
//!
//! 1. Every read of procfs, sysfs and cgroupfs goes through this crate, whose readers
//!    take the configured root (so tests point them at fake trees): no string literal
//!    of the agent's other crates — memcolo-agent, memcolo-tier, memcolo-policy,
//!    memcolo-proto and the `memcolo` binary — contains `/proc`, `/sys/` or
//!    `/sys/fs/cgroup`. Doc comments, comments, `#[cfg(test)]` items and `tests/`
//!    directories are not code the agent runs and are not scanned. memcolo-bench is
//!    exempt: it is the benchmark harness, which builds cgroups and reads the `/proc`
//!    of the workloads it starts, not part of the agent.
//! 2. The crate graph (normal dependencies of the workspace's members, read from their
//!    `Cargo.toml`s, without network) has no cycle; memcolo-policy, the pure policy
//!    layer, depends on no other memcolo crate; and every dependency among the agent's
//!    crates points down the layers policy < {proto, linux} < tier < {agent, bench} <
//!    memcolo.

use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// Crates whose sources may not name kernel pseudo-filesystems.
const SCANNED: &[&str] = &[
    "memcolo-agent",
    "memcolo-tier",
    "memcolo-policy",
    "memcolo-proto",
    "memcolo",
];

/// What a string literal may not contain outside this crate.
const NEEDLES: &[&str] = &["/proc", "/sys/", "/sys/fs/cgroup"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

/// Every `.rs` file under `dir`, except those under a `tests` directory.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let path = e.unwrap().path();
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n == "tests" || n == "target")
            {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Whether `attrs` hold `#[cfg(test)]` or `#[cfg(all(test, ...))]`.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let Ok(list) = a.meta.require_list() else {
            return false;
        };
        let t: String = list
            .tokens
            .to_string()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        t == "test" || (t.starts_with("all(") && t.contains("test") && !t.contains("not(test"))
    })
}

fn item_attrs(i: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match i {
        Const(x) => &x.attrs,
        Enum(x) => &x.attrs,
        ExternCrate(x) => &x.attrs,
        Fn(x) => &x.attrs,
        ForeignMod(x) => &x.attrs,
        Impl(x) => &x.attrs,
        Macro(x) => &x.attrs,
        Mod(x) => &x.attrs,
        Static(x) => &x.attrs,
        Struct(x) => &x.attrs,
        Trait(x) => &x.attrs,
        TraitAlias(x) => &x.attrs,
        Type(x) => &x.attrs,
        Union(x) => &x.attrs,
        Use(x) => &x.attrs,
        _ => &[],
    }
}

/// String literals of the code (macro arguments included) that contain a needle:
/// `(line, value)`.
#[derive(Default)]
struct Finder {
    hits: Vec<(usize, String)>,
}

impl Finder {
    fn check(&mut self, line: usize, value: String) {
        if NEEDLES.iter().any(|n| value.contains(n)) {
            self.hits.push((line, value));
        }
    }

    fn scan_tokens(&mut self, tokens: TokenStream) {
        for t in tokens {
            match t {
                TokenTree::Group(g) => self.scan_tokens(g.stream()),
                TokenTree::Literal(l) => {
                    let line = l.span().start().line;
                    match syn::Lit::new(l) {
                        syn::Lit::Str(s) => self.check(line, s.value()),
                        syn::Lit::ByteStr(s) => {
                            self.check(line, String::from_utf8_lossy(&s.value()).into_owned())
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }
}

impl<'ast> Visit<'ast> for Finder {
    // Doc comments (`#[doc = "..."]`) and attribute arguments are not code.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}

    fn visit_item(&mut self, i: &'ast syn::Item) {
        if !is_cfg_test(item_attrs(i)) {
            syn::visit::visit_item(self, i);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_lit_str(&mut self, s: &'ast syn::LitStr) {
        self.check(s.span().start().line, s.value());
    }

    fn visit_lit_byte_str(&mut self, s: &'ast syn::LitByteStr) {
        self.check(
            s.span().start().line,
            String::from_utf8_lossy(&s.value()).into_owned(),
        );
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.scan_tokens(m.tokens.clone());
    }
}

fn offending_literals(src: &str) -> syn::Result<Vec<(usize, String)>> {
    let file = syn::parse_file(src)?;
    // A test module in a file of its own (`#[cfg(test)] mod tests;`) says so with an
    // inner `#![cfg(test)]`.
    if is_cfg_test(&file.attrs) {
        return Ok(Vec::new());
    }
    let mut f = Finder::default();
    f.visit_file(&file);
    Ok(f.hits)
}

#[test]
fn the_scanner_sees_code_and_skips_docs_comments_and_test_items() {
    let src = r####"
//! Reads `/proc/meminfo`.
/// From `/sys/fs/cgroup`.
fn a() { let _ = std::fs::read("/proc/meminfo"); }
// "/proc/in/a/comment"
fn b(pid: i32) -> String { format!("/proc/{pid}/maps") }
const C: &[u8] = b"/sys/kernel/mm";
#[cfg(test)]
mod tests { fn t() { let _ = "/proc/self"; } }
#[cfg(test)]
fn helper() -> &'static str { "/sys/fs/cgroup/memory" }
#[cfg(not(test))]
fn d() -> &'static str { r#"/sys/fs/cgroup/x"# }
struct S;
impl S {
    #[cfg(test)]
    fn t(&self) -> &str { "/proc/1" }
    fn e(&self) -> &str { "/dev/null" }
}
"####;
    let lines: Vec<usize> = offending_literals(src)
        .unwrap()
        .into_iter()
        .map(|(l, _)| l)
        .collect();
    assert_eq!(lines, vec![4, 6, 7, 13]);
    let test_file = "//! Tests.\n#![cfg(test)]\nfn t() { let _ = \"/proc/self\"; }\n";
    assert!(offending_literals(test_file).unwrap().is_empty());
}

#[test]
fn only_the_linux_layer_names_kernel_filesystems() {
    let root = workspace_root();
    let mut found = Vec::new();
    let mut scanned = 0;
    for krate in SCANNED {
        let mut files = Vec::new();
        rust_files(&root.join("crates").join(krate), &mut files);
        assert!(!files.is_empty(), "no sources found for {krate}");
        for path in files {
            let src = std::fs::read_to_string(&path).unwrap();
            let hits = offending_literals(&src)
                .unwrap_or_else(|e| panic!("{}: cannot parse: {e}", path.display()));
            scanned += 1;
            for (line, value) in hits {
                let rel = path.strip_prefix(&root).unwrap_or(&path);
                found.push(format!("{}:{line}: {value:?}", rel.display()));
            }
        }
    }
    assert!(scanned > 20, "only {scanned} files scanned");
    assert!(
        found.is_empty(),
        "read procfs, sysfs and cgroupfs through memcolo-linux (its readers take the \
         configured root); string literals naming them elsewhere:\n{}",
        found.join("\n")
    );
}

/// Normal dependencies among the workspace's members: crate name → workspace crates
/// it depends on.
fn crate_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = workspace_root();
    let read = |p: &Path| -> toml::Table {
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        text.parse()
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let ws = read(&root.join("Cargo.toml"));
    let members: Vec<String> = ws["workspace"]["members"]
        .as_array()
        .expect("workspace.members")
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    let mut deps_of = BTreeMap::new();
    for m in &members {
        let manifest = read(&root.join(m).join("Cargo.toml"));
        let name = manifest["package"]["name"].as_str().unwrap().to_string();
        let mut tables: Vec<&toml::Table> = Vec::new();
        if let Some(d) = manifest.get("dependencies").and_then(|d| d.as_table()) {
            tables.push(d);
        }
        if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
            for t in targets.values() {
                if let Some(d) = t.get("dependencies").and_then(|d| d.as_table()) {
                    tables.push(d);
                }
            }
        }
        let mut deps = BTreeSet::new();
        for table in tables {
            for (key, spec) in table {
                let real = spec.get("package").and_then(|p| p.as_str()).unwrap_or(key);
                deps.insert(real.to_string());
            }
        }
        deps_of.insert(name, deps);
    }
    let names: BTreeSet<String> = deps_of.keys().cloned().collect();
    for deps in deps_of.values_mut() {
        deps.retain(|d| names.contains(d));
    }
    deps_of
}

#[test]
fn the_crate_graph_is_layered() {
    let g = crate_graph();
    for c in SCANNED.iter().chain(&["memcolo-linux", "memcolo-bench"]) {
        assert!(g.contains_key(*c), "{c} is not a workspace member: {g:?}");
    }
    assert!(
        g["memcolo-policy"].is_empty(),
        "memcolo-policy is the pure policy layer; it depends on {:?}",
        g["memcolo-policy"]
    );

    // No cycle: depth-first search with the path so far.
    fn visit<'a>(
        g: &'a BTreeMap<String, BTreeSet<String>>,
        n: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(at) = path.iter().position(|p| *p == n) {
            panic!("dependency cycle: {} -> {n}", path[at..].join(" -> "));
        }
        if !done.insert(n) {
            return;
        }
        path.push(n);
        for d in &g[n] {
            visit(g, d, path, done);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        visit(&g, n, &mut Vec::new(), &mut done);
    }

    let layer = |c: &str| match c {
        "memcolo-policy" => Some(0),
        "memcolo-proto" | "memcolo-linux" => Some(1),
        "memcolo-tier" => Some(2),
        "memcolo-agent" | "memcolo-bench" => Some(3),
        "memcolo" => Some(4),
        _ => None,
    };
    for (c, deps) in &g {
        let Some(lc) = layer(c) else { continue };
        for d in deps {
            if let Some(ld) = layer(d) {
                assert!(ld < lc, "{c} (layer {lc}) depends on {d} (layer {ld})");
            }
        }
    }
}
