//! The configuration's documents agree with `AgentConfig::default()`: the annotated
//! example `dist/agent.toml` (installed as `/etc/memcolo/agent.toml.example`) shows
//! every field, commented out, with its default and a comment, and the README's
//! configuration table lists every field with its default.
//!
//! Fields are enumerated from the default configuration serialised to JSON, so an
//! unset (`None`) field counts too; a new field that neither document names fails
//! here, and the README test prints the rows it expects.

use memcolo_agent::config::AgentConfig;
use serde_json::Value;
use std::path::PathBuf;

fn repo_file(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every leaf of the default configuration: `(dotted name, value)`, `null` for unset.
fn default_fields() -> Vec<(String, Value)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let name = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&name, v, out);
                }
            }
            _ => out.push((prefix.to_string(), v.clone())),
        }
    }
    let mut out = Vec::new();
    walk(
        "",
        &serde_json::to_value(AgentConfig::default()).unwrap(),
        &mut out,
    );
    out
}

fn lookup<'a>(v: &'a Value, dotted: &str) -> &'a Value {
    dotted.split('.').fold(v, |v, k| &v[k])
}

/// A TOML value as JSON, parsed from its text (`[1, 32]`, `"host"`, `0.5`).
fn toml_value(text: &str) -> Option<Value> {
    let t: toml::Table = toml::from_str(&format!("v = {text}")).ok()?;
    serde_json::to_value(&t["v"]).ok()
}

/// Whether two JSON values are the same setting (numbers compared as numbers).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[test]
fn the_example_config_is_the_defaults_commented_out_with_every_field_annotated() {
    let text = repo_file("dist/agent.toml");
    // As installed, every setting is commented out: the file means the defaults.
    let as_is: AgentConfig = toml::from_str(&text).expect("dist/agent.toml parses");
    assert_eq!(as_is, AgentConfig::default());
    // Each `#name = value` line is preceded by its comment.
    let lines: Vec<&str> = text.lines().collect();
    let setting = |l: &str| {
        l.strip_prefix('#')
            .filter(|r| r.starts_with(|c: char| c.is_ascii_lowercase()) && r.contains(" = "))
            .map(str::to_string)
    };
    for (i, l) in lines.iter().enumerate() {
        if let Some(s) = setting(l) {
            assert!(
                i > 0 && lines[i - 1].starts_with("# "),
                "dist/agent.toml line {}: `{s}` has no comment above it",
                i + 1
            );
        }
    }
    // Uncommented, it must still be a valid file (names in the right sections),
    // give every set field its default and every unset one an example.
    let uncommented: String = lines
        .iter()
        .map(|l| setting(l).unwrap_or_else(|| l.to_string()) + "\n")
        .collect();
    let all: AgentConfig = toml::from_str(&uncommented)
        .unwrap_or_else(|e| panic!("dist/agent.toml with its settings uncommented: {e}"));
    let all = serde_json::to_value(all).unwrap();
    let mut wrong = Vec::new();
    for (name, default) in default_fields() {
        let shown = lookup(&all, &name);
        if default.is_null() {
            if shown.is_null() {
                wrong.push(format!("{name}: unset by default, no example given"));
            }
        } else if !same(shown, &default) {
            wrong.push(format!("{name}: shows {shown}, the default is {default}"));
        }
    }
    assert!(wrong.is_empty(), "dist/agent.toml:\n{}", wrong.join("\n"));
}

/// The README's configuration table: `(field, default text)` per field named, the
/// `a` / `b` rows split into one entry each.
fn readme_rows() -> Vec<(String, String)> {
    let text = repo_file("README.md");
    let start = text
        .find("## Configuration reference")
        .expect("README has a configuration reference");
    let section = &text[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    let mut rows = Vec::new();
    for line in section[..end].lines() {
        let cells: Vec<&str> = line.split(" | ").map(str::trim).collect();
        if !line.starts_with("| `") || cells.len() < 3 {
            continue;
        }
        let fields: Vec<String> = cells[0]
            .trim_start_matches('|')
            .split(" / ")
            .map(|f| f.trim().trim_matches('`').to_string())
            .collect();
        let defaults: Vec<&str> = cells[1].split(" / ").collect();
        for (k, f) in fields.iter().enumerate() {
            let d = if defaults.len() == fields.len() {
                defaults[k]
            } else {
                cells[1]
            };
            rows.push((f.clone(), d.trim().to_string()));
        }
    }
    rows
}

/// The README's default text as a value: `` `"host"` `` and `` `/proc` `` are
/// strings, `` `[1, 32]` `` an array; `None` for prose ("unset", "top × 50/62").
fn readme_value(text: &str) -> Option<Value> {
    let t = text.strip_prefix('`')?.strip_suffix('`')?;
    toml_value(t).or_else(|| Some(Value::String(t.trim_matches('"').to_string())))
}

#[test]
fn the_readme_table_lists_every_field_with_its_default() {
    let rows = readme_rows();
    let fields = default_fields();
    let mut wrong = Vec::new();
    let mut expected = Vec::new();
    for (name, default) in &fields {
        let Some((_, text)) = rows.iter().find(|(f, _)| f == name) else {
            wrong.push(format!("{name}: missing"));
            let shown = match default {
                Value::Null => "unset".to_string(),
                v => format!(
                    "`{}`",
                    toml::to_string(&toml::Table::from_iter([(
                        "v".to_string(),
                        toml::Value::try_from(v).unwrap()
                    )]))
                    .unwrap()
                    .trim_start_matches("v = ")
                    .trim()
                ),
            };
            expected.push(format!("| `{name}` | {shown} | ... |"));
            continue;
        };
        if default.is_null() {
            continue;
        }
        match readme_value(text) {
            Some(v) if same(&v, default) => {}
            _ => wrong.push(format!(
                "{name}: README says {text}, the default is {default}"
            )),
        }
    }
    for (f, _) in &rows {
        if !fields.iter().any(|(n, _)| n == f) {
            wrong.push(format!("{f}: in the README, not a field"));
        }
    }
    assert!(
        wrong.is_empty(),
        "README.md configuration table:\n{}\nrows for the missing fields:\n{}",
        wrong.join("\n"),
        expected.join("\n")
    );
}
