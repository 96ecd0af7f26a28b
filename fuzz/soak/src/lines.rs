//! Hostile JSON lines for the agent's sockets (`docs/protocol.md` §2 framing): mutated
//! valid requests, invalid ones, random bytes, over-long lines, `\r\n` and blank
//! lines, and the model of how many replies the agent owes for a batch of them.

use fastrand::Rng;
use memcolo_proto::MAX_LINE_BYTES;

/// Lines to start from: valid and invalid examples of one socket's requests.
pub struct Seeds {
    pub lines: Vec<Vec<u8>>,
}

impl Seeds {
    /// The seed files of a fuzz target (`fuzz/seeds/<target>/`), one line each.
    pub fn load(dir: &std::path::Path) -> anyhow::Result<Seeds> {
        let mut lines = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let mut b = std::fs::read(e?.path())?;
            b.retain(|&c| c != b'\n');
            if b.len() <= 4096 {
                lines.push(b);
            }
        }
        anyhow::ensure!(!lines.is_empty(), "no seed lines in {}", dir.display());
        Ok(Seeds { lines })
    }
}

const TOKENS: &[&[u8]] = &[
    b"\"v\":1",
    b"\"v\":0",
    b"\"v\":2",
    b"\"v\":18446744073709551616",
    b"\"type\":\"ping\"",
    b"\"type\":\"status\"",
    b"\"pid\":-1",
    b"\"pid\":0",
    b"\"pid\":1",
    b"\"pid\":2147483648",
    b"\"class\":\"be\"",
    b"\"notify\":\"signal\"",
    b"\"notify\":\"none\"",
    b"null",
    b"true",
    b"1e308",
    b"-0",
    b"1e-400",
    b"NaN",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"{}",
    b"[]",
    b",",
    b":",
    b"\"t_miss\":0",
    b"\"t_miss\":1e-300",
    b"\"t_miss\":2",
    b"\"start\":18446744073709551615",
    b"\"length\":0",
    b"\xff\xfe",
    b"\xc3\x28",
    b"\r",
    b" ",
    b"\t",
    b"\n",
];

/// Applies 1–4 random edits to `line`: byte flips, insertions and deletions, range
/// duplication, protocol tokens, deep nesting, and splices with another seed.
pub fn mutate(rng: &mut Rng, seeds: &Seeds, line: &[u8]) -> Vec<u8> {
    let mut b = line.to_vec();
    for _ in 0..rng.usize(1..=4) {
        let n = b.len();
        match rng.u8(0..9) {
            0 if n > 0 => {
                let i = rng.usize(0..n);
                b[i] ^= 1 << rng.u8(0..8);
            }
            1 => {
                let i = rng.usize(0..=n);
                b.insert(i, rng.u8(..));
            }
            2 if n > 0 => {
                let i = rng.usize(0..n);
                let j = rng.usize(i..=n.min(i + 16));
                b.drain(i..j);
            }
            3 if n > 0 => {
                let i = rng.usize(0..n);
                let j = rng.usize(i..=n.min(i + 32));
                let part = b[i..j].to_vec();
                let at = rng.usize(0..=b.len());
                b.splice(at..at, part);
            }
            4 | 5 => {
                let t = TOKENS[rng.usize(0..TOKENS.len())];
                let at = rng.usize(0..=n);
                b.splice(at..at, t.iter().copied());
            }
            6 => {
                let depth = rng.usize(1..2000);
                let at = rng.usize(0..=n);
                let (open, close) = if rng.bool() {
                    (b'[', b']')
                } else {
                    (b'{', b'}')
                };
                let mut nest = vec![open; depth];
                if rng.bool() {
                    nest.extend(std::iter::repeat_n(close, depth));
                }
                b.splice(at..at, nest);
            }
            7 => {
                let other = &seeds.lines[rng.usize(0..seeds.lines.len())];
                let i = rng.usize(0..=n);
                let j = rng.usize(0..=other.len());
                b.truncate(i);
                b.extend_from_slice(&other[j..]);
            }
            _ => {
                // A number replaced by an extreme one.
                if let Some(i) = b.iter().position(|c| c.is_ascii_digit()) {
                    let big: &[u8] = match rng.u8(0..4) {
                        0 => b"99999999999999999999999",
                        1 => b"-9223372036854775809",
                        2 => b"4.9e-324",
                        _ => b"0.0000000000000000000000000000001",
                    };
                    b.splice(i..i + 1, big.iter().copied());
                }
            }
        }
    }
    b
}

/// Appends one segment to `out`, newline included (the segment may hold newlines of
/// its own: the receiver sees several lines then).
pub fn push_line(rng: &mut Rng, seeds: &Seeds, out: &mut Vec<u8>) {
    let seed = &seeds.lines[rng.usize(0..seeds.lines.len())];
    match rng.u8(0..100) {
        0..=9 => out.extend_from_slice(seed),
        10..=64 => out.extend_from_slice(&mutate(rng, seeds, seed)),
        65..=79 => {
            let n = rng.usize(0..256);
            out.extend(std::iter::repeat_with(|| rng.u8(..)).take(n));
        }
        80..=84 => {
            out.extend_from_slice(seed);
            out.push(b'\r');
        }
        85..=89 => out.extend_from_slice(match rng.u8(0..3) {
            0 => &b""[..],
            1 => b"   \t",
            _ => b"\r",
        }),
        90 => {
            // Over the limit: usually just over, sometimes 1 MiB.
            let fill = if rng.u16(0..100) == 0 {
                1 << 20
            } else {
                MAX_LINE_BYTES + rng.usize(1..4096)
            };
            out.extend_from_slice(b"{\"v\":1,\"type\":\"cgroup\",\"name\":\"");
            out.extend(std::iter::repeat_n(b'x', fill));
            out.extend_from_slice(b"\"}");
        }
        91 => {
            // Exactly at the limit.
            const HEAD: &[u8] = b"{\"v\":1,\"type\":\"ping\",\"pad\":\"";
            out.extend_from_slice(HEAD);
            out.extend(std::iter::repeat_n(b'y', MAX_LINE_BYTES - HEAD.len() - 2));
            out.extend_from_slice(b"\"}");
        }
        _ => out.extend_from_slice(&mutate(rng, seeds, seed)),
    }
    out.push(b'\n');
}

/// How many replies the agent socket owes for `stream` (complete lines only): one per
/// `\n`-terminated line, except blank ones (`docs/protocol.md` §2; the agent's
/// `server::read_line`); an over-long line gets one `bad_request`.
pub fn replies_owed(stream: &[u8]) -> usize {
    let mut owed = 0;
    let mut rest = stream;
    while let Some(i) = rest.iter().position(|&c| c == b'\n') {
        let line = &rest[..i];
        if line.len() > MAX_LINE_BYTES || !String::from_utf8_lossy(line).trim().is_empty() {
            owed += 1;
        }
        rest = &rest[i + 1..];
    }
    owed
}

/// Writes `data` in random chunks (1 byte to 64 KiB, or all at once), so that the
/// receiver sees lines split across reads.
pub fn write_chunked(
    rng: &mut Rng,
    w: &mut impl std::io::Write,
    data: &[u8],
) -> std::io::Result<()> {
    if rng.bool() {
        return w.write_all(data);
    }
    let mut rest = data;
    while !rest.is_empty() {
        let n = match rng.u8(0..4) {
            0 => rng.usize(1..8),
            1 => rng.usize(1..512),
            _ => rng.usize(1..65536),
        }
        .min(rest.len());
        w.write_all(&rest[..n])?;
        rest = &rest[n..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owed_counts_lines_as_the_agent_does() {
        assert_eq!(replies_owed(b"{}\n\n  \r\nx\npartial"), 2);
        let mut long = vec![b'a'; MAX_LINE_BYTES + 1];
        long.push(b'\n');
        assert_eq!(replies_owed(&long), 1);
    }

    #[test]
    fn the_line_at_the_limit_is_at_the_limit() {
        let seeds = Seeds {
            lines: vec![b"{}".to_vec()],
        };
        let mut rng = Rng::with_seed(1);
        for _ in 0..2000 {
            let mut out = Vec::new();
            push_line(&mut rng, &seeds, &mut out);
            if out.starts_with(b"{\"v\":1,\"type\":\"ping\",\"pad\"") {
                assert_eq!(out.len(), MAX_LINE_BYTES + 1);
                return;
            }
        }
        panic!("no line at the limit in 2000 draws");
    }
}
