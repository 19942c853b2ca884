//! The man pages (`man/`) against the code: every flag and subcommand of the
//! three programs, and every configuration key with its default and whether
//! it reloads live, must be documented — and nothing documented may be gone.
//!
//! The pages are mdoc(7); these tests read their source, not a rendering, so
//! they need no mandoc. Conventions they rely on: flags are written with `Fl`,
//! subcommands with `Cm`; `dtf(1)` has one `.Ss dtf <subcommand>` per
//! subcommand; `dtf.toml(5)` has one `.Ss [<section>]` per section and one
//! `.It Cm <key>` per key, whose text has a line `Default: <TOML value>.` and
//! a line `Reloads live.` or `Needs a restart.`.

use crate::util::{output_within, repo_file};
use clap::CommandFactory;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

fn man(name: &str) -> String {
    let path = repo_file(&format!("man/{name}"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether a token is an mdoc macro name that can follow `Fl` (`Ar`, `Cm`, …)
/// or a delimiter, rather than a flag's name.
fn is_macro_or_delimiter(token: &str) -> bool {
    let macro_like = (2..=3).contains(&token.len())
        && token.starts_with(|c: char| c.is_ascii_uppercase())
        && token[1..].chars().all(|c| c.is_ascii_lowercase());
    macro_like || matches!(token, "|" | "," | "." | ";" | ":" | "(" | ")" | "[" | "]")
}

/// The flags a piece of mdoc source writes with `Fl`: `.Fl c , Fl -config`
/// gives `-c` and `--config`.
fn man_flags(src: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for line in src.lines().filter(|l| l.starts_with('.')) {
        let tokens: Vec<&str> = line[1..].split_whitespace().collect();
        for pair in tokens.windows(2) {
            if pair[0] == "Fl" && !is_macro_or_delimiter(pair[1]) {
                flags.insert(format!("-{}", pair[1]));
            }
        }
    }
    flags
}

/// The subcommands a piece of mdoc source names with `Cm`.
fn man_commands(src: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for line in src.lines().filter(|l| l.starts_with('.')) {
        let tokens: Vec<&str> = line[1..].split_whitespace().collect();
        for pair in tokens.windows(2) {
            if pair[0] == "Cm" {
                words.insert(pair[1].to_owned());
            }
        }
    }
    words
}

/// Splits mdoc source at the lines starting with `prefix` (e.g. `.Ss `):
/// heading → the lines up to the next heading of that kind or the next `.Sh`.
fn sections(src: &str, prefix: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in src.lines() {
        if line.starts_with(prefix) || line.starts_with(".Sh ") {
            if let Some((head, body)) = current.take() {
                out.insert(head, body);
            }
            if let Some(head) = line.strip_prefix(prefix) {
                current = Some((head.trim().to_owned(), String::new()));
            }
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((head, body)) = current {
        out.insert(head, body);
    }
    out
}

/// Every flag of a clap command (with `-h`/`--help`, `-V`/`--version`).
fn clap_flags(cmd: &clap::Command) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for arg in cmd.get_arguments().filter(|a| !a.is_positional()) {
        if let Some(s) = arg.get_short() {
            flags.insert(format!("-{s}"));
        }
        if let Some(l) = arg.get_long() {
            flags.insert(format!("--{l}"));
        }
        // A visible alias is part of the interface (`--task_index`).
        for alias in arg.get_visible_aliases().unwrap_or_default() {
            flags.insert(format!("--{alias}"));
        }
    }
    flags
}

#[test]
fn daemon_man_pages_document_every_flag_and_subcommand() {
    let mut cmd = dtf::daemon::Args::command();
    cmd.build();
    let flags = clap_flags(&cmd);
    assert!(
        flags.contains("--config") && flags.contains("--task"),
        "unexpected CLI: {flags:?}"
    );
    let subcommands: BTreeSet<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .filter(|n| n != "help")
        .collect();
    assert!(!subcommands.is_empty());
    for page in ["dtf-ps.8", "dtf-worker.8", "dtf-evaluator.8"] {
        let src = man(page);
        // Described in the option list, not only named in the SYNOPSIS.
        let description = sections(&src, ".Sh ")
            .remove("DESCRIPTION")
            .unwrap_or_default();
        let described = man_flags(&description);
        let missing: Vec<_> = flags.difference(&described).collect();
        assert!(
            missing.is_empty(),
            "man/{page} does not describe {missing:?}"
        );
        let documented = man_flags(&src);
        let stale: Vec<_> = documented.difference(&flags).collect();
        assert!(
            stale.is_empty(),
            "man/{page} documents {stale:?}, which the daemons do not have"
        );
        let commands = man_commands(&src);
        let missing: Vec<_> = subcommands.difference(&commands).collect();
        assert!(
            missing.is_empty(),
            "man/{page} does not document the subcommands {missing:?}"
        );
    }
}

/// Runs the `dtf` binary with `args` and returns its standard output.
fn dtf_help(args: &[&str]) -> String {
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_dtf")).args(args),
        std::time::Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "dtf {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("dtf --help is UTF-8")
}

/// The lines of a clap help section (`Commands:`, `Options:`) up to the next
/// blank line.
fn help_section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| l.trim() != title)
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

/// Subcommand names listed by `dtf --help`.
fn help_commands(help: &str) -> BTreeSet<String> {
    help_section(help, "Commands:")
        .iter()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_owned)
        .collect()
}

/// Flags listed by `dtf … --help`: `  -c, --config <CONFIG>  The file`.
fn help_flags(help: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for line in help_section(help, "Options:") {
        let line = line.trim_start();
        if !line.starts_with('-') {
            continue; // a description line of the long help
        }
        let spec = line.split("  ").next().unwrap_or(line);
        for part in spec.split(", ") {
            if let Some(flag) = part.split_whitespace().next() {
                flags.insert(flag.to_owned());
            }
        }
    }
    flags
}

#[test]
fn dtf_man_page_documents_every_subcommand_and_flag() {
    let src = man("dtf.1");
    let all_flags = man_flags(&src);
    let subsections = sections(&src, ".Ss ");
    let top = dtf_help(&["--help"]);
    let subcommands = help_commands(&top);
    assert!(
        subcommands.contains("local") && subcommands.contains("check-config"),
        "parsed {subcommands:?} from:\n{top}"
    );

    // The global flags (--help, --version) may be anywhere in the page.
    let global = help_flags(&top);
    assert!(global.contains("--help"), "parsed {global:?} from:\n{top}");
    let missing: Vec<_> = global.difference(&all_flags).collect();
    assert!(
        missing.is_empty(),
        "man/dtf.1 does not document {missing:?}"
    );

    let documented: BTreeSet<String> = subsections
        .keys()
        .filter_map(|h| h.strip_prefix("dtf "))
        .map(str::to_owned)
        .collect();
    let missing: Vec<_> = subcommands.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "man/dtf.1 has no `.Ss dtf <subcommand>` for {missing:?}"
    );
    let stale: Vec<_> = documented.difference(&subcommands).collect();
    assert!(
        stale.is_empty(),
        "man/dtf.1 documents {stale:?}, which dtf does not have"
    );

    let mut every_flag = global.clone();
    for sub in &subcommands {
        let flags = help_flags(&dtf_help(&[sub, "--help"]));
        let in_section = man_flags(&subsections[&format!("dtf {sub}")]);
        let missing: Vec<_> = flags
            .difference(&global)
            .filter(|f| !in_section.contains(*f))
            .collect();
        assert!(
            missing.is_empty(),
            "man/dtf.1, `dtf {sub}`, does not document {missing:?}"
        );
        every_flag.extend(flags);
    }
    let stale: Vec<_> = all_flags.difference(&every_flag).collect();
    assert!(
        stale.is_empty(),
        "man/dtf.1 documents {stale:?}, which dtf does not have"
    );
}

/// One key's entry in dtf.toml(5).
#[derive(Debug)]
struct KeyDoc {
    /// The text after `.It Cm key`, up to the next entry.
    body: String,
}

impl KeyDoc {
    /// The value of the `Default: <value>.` line, as written.
    fn default_text(&self) -> Option<&str> {
        self.body
            .lines()
            .find_map(|l| l.strip_prefix("Default: "))
            .map(|v| v.strip_suffix('.').unwrap_or(v))
    }

    /// `Some(true)` for "Reloads live.", `Some(false)` for "Needs a restart.",
    /// `None` if it says neither or both.
    fn reloads_live(&self) -> Option<bool> {
        let live = self.body.lines().any(|l| l == "Reloads live.");
        let restart = self.body.lines().any(|l| l == "Needs a restart.");
        (live != restart).then_some(live)
    }
}

/// `section.key` → its entry, from the KEYS part of dtf.toml(5).
fn documented_keys() -> BTreeMap<String, KeyDoc> {
    let src = man("dtf.toml.5");
    let keys_part = sections(&src, ".Sh ")
        .remove("KEYS")
        .expect("man/dtf.toml.5 has a KEYS section");
    let mut keys = BTreeMap::new();
    for (head, body) in sections(&keys_part, ".Ss ") {
        let section = head
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        for (item, text) in sections(&body, ".It ") {
            let mut words = item.split_whitespace();
            if words.next() == Some("Cm")
                && let Some(key) = words.next()
            {
                let text = text.split("\n.El").next().unwrap_or(&text).to_owned();
                keys.insert(format!("{section}.{key}"), KeyDoc { body: text });
            }
        }
    }
    keys
}

/// `section.key` → default, from `Config::default()`. Keys whose default is
/// "unset" (`None`) are not serialized; they are added as `None`.
fn config_keys() -> BTreeMap<String, Option<toml::Value>> {
    let value = toml::Value::try_from(dtf::config::Config::default()).expect("Config serializes");
    let mut keys = BTreeMap::new();
    for (section, table) in value.as_table().expect("a table") {
        for (key, v) in table
            .as_table()
            .unwrap_or_else(|| panic!("[{section}] is a table"))
        {
            // A sub-table (`[model.tables]`) is a section of its own.
            match v.as_table() {
                Some(sub) => keys.extend(
                    sub.iter()
                        .map(|(k, v)| (format!("{section}.{key}.{k}"), Some(v.clone()))),
                ),
                None => {
                    keys.insert(format!("{section}.{key}"), Some(v.clone()));
                }
            }
        }
    }
    for optional in [
        "checkpoint.save_secs",
        "train.replicas_to_aggregate",
        "train.total_num_replicas",
        "security.tls_cert",
        "security.tls_key",
        "security.tls_ca",
        "model.hidden",
        "data.path",
        "data.train",
        "data.test",
        "data.threshold",
        "model.tables.optimizer",
        "model.tables.linear_optimizer",
    ] {
        keys.entry(optional.to_owned()).or_insert(None);
    }
    keys
}

fn same_value(a: &toml::Value, b: &toml::Value) -> bool {
    use toml::Value::{Array, Float, Integer};
    match (a, b) {
        (Float(x), Float(y)) => (x - y).abs() <= 1e-6 * x.abs().max(y.abs()),
        (Float(x), Integer(i)) | (Integer(i), Float(x)) => (*x - *i as f64).abs() <= 1e-6 * x.abs(),
        (Array(x), Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b))
        }
        _ => a == b,
    }
}

#[test]
fn config_man_page_documents_every_key_with_its_default() {
    let documented = documented_keys();
    let keys = config_keys();
    let missing: Vec<_> = keys
        .keys()
        .filter(|k| !documented.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "man/dtf.toml.5 does not document {missing:?}"
    );
    let stale: Vec<_> = documented
        .keys()
        .filter(|k| !keys.contains_key(*k))
        .collect();
    assert!(
        stale.is_empty(),
        "man/dtf.toml.5 documents {stale:?}, which the configuration does not have"
    );

    for (key, default) in &keys {
        let doc = &documented[key];
        let text = doc
            .default_text()
            .unwrap_or_else(|| panic!("man/dtf.toml.5: {key} has no `Default: <value>.` line"));
        assert!(
            doc.reloads_live().is_some(),
            "man/dtf.toml.5: {key} must say either `Reloads live.` or `Needs a restart.`"
        );
        let Some(default) = default else { continue };
        let parsed = toml::from_str::<toml::Table>(&format!("v = {text}")).unwrap_or_else(|e| {
            panic!("man/dtf.toml.5: {key}: `Default: {text}.` is not a TOML value: {e}")
        });
        assert!(
            same_value(&parsed["v"], default),
            "man/dtf.toml.5: {key}: documented default {text}, but the default is {default}"
        );
    }
}

/// `section.key` → whether the comment above it says "Reloads live", from the
/// shipped `etc/dtf/dtf.toml` (keys commented out count too), or `None` if
/// that file is not in the tree.
fn shipped_reloadable() -> Option<BTreeMap<String, bool>> {
    let text = std::fs::read_to_string(repo_file("etc/dtf/dtf.toml")).ok()?;
    let mut keys = BTreeMap::new();
    let (mut section, mut comment) = (String::new(), String::new());
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            comment.clear();
        } else if line.is_empty() {
            comment.clear();
        } else {
            let assignment = line.trim_start_matches('#').trim_start();
            let key = assignment.split('=').next().unwrap_or("").trim();
            let is_key = assignment.contains('=')
                && !key.is_empty()
                && key.chars().all(|c| c.is_ascii_lowercase() || c == '_');
            if is_key && !section.is_empty() {
                keys.insert(format!("{section}.{key}"), comment.contains("Reloads live"));
                comment.clear();
            } else {
                comment.push_str(line);
                comment.push('\n');
            }
        }
    }
    Some(keys)
}

#[test]
fn config_man_page_says_what_reloads_live_as_the_shipped_file_does() {
    let Some(shipped) = shipped_reloadable() else {
        eprintln!("etc/dtf/dtf.toml is not in this tree: nothing to compare with");
        return;
    };
    assert!(
        shipped.values().any(|live| *live),
        "parsed no reloadable key from etc/dtf/dtf.toml: {shipped:?}"
    );
    let documented = documented_keys();
    for (key, live) in &shipped {
        let doc = documented.get(key).unwrap_or_else(|| {
            panic!("man/dtf.toml.5 does not document {key} (in etc/dtf/dtf.toml)")
        });
        assert_eq!(
            doc.reloads_live(),
            Some(*live),
            "{key}: etc/dtf/dtf.toml says it {}, man/dtf.toml.5 does not",
            if *live {
                "reloads live"
            } else {
                "needs a restart"
            }
        );
    }
}

#[test]
fn man_flag_parser_reads_mdoc() {
    let src = ".It Fl c Ar file , Fl -config Ar file\n.Op Fl -mode Cm async | sync\n.Fl h | Fl V\ntext Fl x\n";
    let want: BTreeSet<String> = ["-c", "--config", "--mode", "-h", "-V"]
        .map(String::from)
        .into();
    assert_eq!(man_flags(src), want);
}

#[test]
fn config_man_page_says_reloads_live_for_exactly_the_live_keys() {
    let live: BTreeSet<&str> = dtf::config::LIVE_KEYS.iter().map(|k| k.key).collect();
    for (key, doc) in documented_keys() {
        assert_eq!(
            doc.reloads_live(),
            Some(live.contains(key.as_str())),
            "man/dtf.toml.5: {key}: dtf::config::LIVE_KEYS says it {}",
            if live.contains(key.as_str()) {
                "reloads live"
            } else {
                "needs a restart"
            }
        );
    }
}

/// The SYNOPSIS of mdoc source as its blocks, one per `.Nm` line: each
/// block's lines up to the next `.Nm`.
fn synopsis_blocks(src: &str) -> Vec<String> {
    let synopsis = sections(src, ".Sh ").remove("SYNOPSIS").unwrap_or_default();
    let mut blocks: Vec<String> = Vec::new();
    for line in synopsis.lines() {
        if line.trim() == ".Nm" {
            blocks.push(String::new());
        } else if let Some(b) = blocks.last_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    blocks
}

/// Each option of `dtf … --help` as the set of its spellings
/// (`-c, --config <CONFIG>` → {`-c`, `--config`}), without help and version.
fn help_args(help: &str) -> Vec<BTreeSet<String>> {
    help_section(help, "Options:")
        .iter()
        .map(|l| l.trim_start())
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let spec = l.split("  ").next().unwrap_or(l);
            spec.split(", ")
                .filter_map(|p| p.split_whitespace().next())
                .map(str::to_owned)
                .collect::<BTreeSet<String>>()
        })
        .filter(|s| !s.contains("--help") && !s.contains("--version"))
        .collect()
}

/// Checks that a SYNOPSIS block names each option (in one of its
/// spellings) and nothing else.
fn assert_synopsis(what: &str, block: &str, args: &[BTreeSet<String>]) {
    let named = man_flags(block);
    let missing: Vec<_> = args.iter().filter(|a| a.is_disjoint(&named)).collect();
    assert!(missing.is_empty(), "{what}: the SYNOPSIS omits {missing:?}");
    let stale: Vec<_> = named
        .iter()
        .filter(|f| !args.iter().any(|a| a.contains(*f)))
        .collect();
    assert!(
        stale.is_empty(),
        "{what}: the SYNOPSIS names {stale:?}, which the command does not have"
    );
}

#[test]
fn every_synopsis_names_exactly_the_options_of_its_command() {
    let src = man("dtf.1");
    let blocks = synopsis_blocks(&src);
    let top = dtf_help(&["--help"]);
    let subcommands = help_commands(&top);
    for sub in &subcommands {
        let block = blocks
            .iter()
            .find(|b| {
                b.lines()
                    .next()
                    .is_some_and(|l| l.trim() == format!(".Cm {sub}"))
            })
            .unwrap_or_else(|| panic!("man/dtf.1 has no SYNOPSIS line for `dtf {sub}`"));
        let args = help_args(&dtf_help(&[sub, "--help"]));
        assert_synopsis(&format!("man/dtf.1, dtf {sub}"), block, &args);
    }
    // The daemons: every block but the `-h | -V` one names every option.
    let mut cmd = dtf::daemon::Args::command();
    cmd.build();
    let args: Vec<BTreeSet<String>> = cmd
        .get_arguments()
        .filter(|a| !a.is_positional())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| {
            let mut spellings: BTreeSet<String> = a
                .get_short()
                .map(|s| format!("-{s}"))
                .into_iter()
                .chain(a.get_long().map(|l| format!("--{l}")))
                .collect();
            for alias in a.get_visible_aliases().unwrap_or_default() {
                spellings.insert(format!("--{alias}"));
            }
            spellings
        })
        .collect();
    for page in ["dtf-ps.8", "dtf-worker.8", "dtf-evaluator.8"] {
        let src = man(page);
        let blocks = synopsis_blocks(&src);
        assert!(blocks.len() >= 2, "man/{page}: {blocks:?}");
        for block in blocks.iter().filter(|b| !b.contains("Fl h | Fl V")) {
            assert_synopsis(&format!("man/{page}"), block, &args);
        }
    }
}
