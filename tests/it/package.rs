//! The Debian packaging (`packaging/debian/`, `[package.metadata.deb]`)
//! against the code: the units run command lines the daemons accept, with
//! the exit code and user the code assumes, and the package ships every man
//! page and unit. The .deb itself, lintian and systemd-analyze are checked by
//! `scripts/check-package.sh`.

use crate::util::repo_file;
use clap::Parser;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn read(rel: &str) -> String {
    let path = repo_file(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `Key` → its values in the `[Service]` (or any) section of a unit file.
fn unit_values(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            values.entry(k.to_owned()).or_default().push(v.to_owned());
        }
    }
    values
}

const UNITS: [(&str, &str); 3] = [
    ("dtf-ps@.service", "dtf-ps"),
    ("dtf-worker@.service", "dtf-worker"),
    ("dtf-evaluator.service", "dtf-evaluator"),
];

#[test]
fn units_run_command_lines_the_daemons_accept() {
    for (unit, bin) in UNITS {
        let values = unit_values(&read(&format!("packaging/debian/{unit}")));
        let mut lines = Vec::new();
        for key in ["ExecStartPre", "ExecStart", "ExecReload"] {
            lines.extend(
                values
                    .get(key)
                    .into_iter()
                    .flatten()
                    .map(|v| (key, v.clone())),
            );
        }
        let ours: Vec<_> = lines
            .iter()
            .map(|(k, v)| (*k, v.trim_start_matches('-').to_string()))
            .filter(|(_, v)| v.starts_with("/usr/bin/dtf"))
            .collect();
        assert!(
            ours.len() >= 3,
            "{unit}: expected ExecStartPre, ExecStart and ExecReload running {bin}, got {lines:?}"
        );
        for (key, line) in ours {
            let argv: Vec<String> = line
                .split_whitespace()
                .map(|w| w.replace("%i", "0"))
                .collect();
            assert_eq!(
                argv[0],
                format!("/usr/bin/{bin}"),
                "{unit}: {key} runs the wrong program"
            );
            let args = dtf::daemon::Args::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("{unit}: {key}={line}: {e}"));
            assert_eq!(
                args.task,
                Some(0),
                "{unit}: {key} must pass the instance as --task"
            );
            let validates = args.command.is_some();
            match key {
                "ExecStart" => assert!(!validates, "{unit}: ExecStart must start the daemon"),
                _ => assert!(validates, "{unit}: {key} must run check-config"),
            }
        }
        assert!(
            values["ExecReload"]
                .iter()
                .any(|v| v.contains("kill -HUP $MAINPID")),
            "{unit}: ExecReload must send SIGHUP after validating"
        );
    }
}

#[test]
fn units_agree_with_the_daemons_lifecycle() {
    for (unit, _) in UNITS {
        let values = unit_values(&read(&format!("packaging/debian/{unit}")));
        let one = |k: &str| {
            values
                .get(k)
                .and_then(|v| v.last())
                .map(String::as_str)
                .unwrap_or_else(|| panic!("{unit}: no {k}="))
        };
        assert_eq!(one("Type"), "notify", "{unit}");
        assert_eq!(one("NotifyAccess"), "main", "{unit}");
        assert_eq!(one("Restart"), "on-failure", "{unit}");
        let prevent: Vec<&str> = one("RestartPreventExitStatus").split_whitespace().collect();
        assert!(
            prevent.contains(&dtf::daemon::EX_CONFIG.to_string().as_str()),
            "{unit}: RestartPreventExitStatus must hold EX_CONFIG ({})",
            dtf::daemon::EX_CONFIG
        );
        assert!(
            one("WatchdogSec").parse::<u64>().is_ok_and(|s| s > 0),
            "{unit}: WatchdogSec"
        );
        // The daemon bounds its drain at 30 s; systemd must wait longer.
        assert!(
            one("TimeoutStopSec").parse::<u64>().is_ok_and(|s| s > 30),
            "{unit}: TimeoutStopSec"
        );
        assert_eq!(one("User"), "dtf", "{unit}");
        assert_eq!(
            one("StateDirectory"),
            "dtf",
            "{unit}: checkpoints default to /var/lib/dtf/checkpoints"
        );
        assert!(
            !values.contains_key("PrivateNetwork"),
            "{unit}: the cluster spans hosts"
        );
        assert!(
            !values.contains_key("IPAddressDeny"),
            "{unit}: the cluster spans hosts"
        );
    }
    let defaults = dtf::config::Config::default();
    assert!(
        defaults.checkpoint.dir.starts_with("/var/lib/dtf"),
        "the units only let the daemons write below /var/lib/dtf"
    );
    assert_eq!(
        defaults.security.token_file,
        PathBuf::from("/etc/dtf/token"),
        "postinst generates /etc/dtf/token"
    );
}

#[test]
fn package_ships_every_man_page_unit_and_script() {
    let manifest: toml::Table = toml::from_str(&read("Cargo.toml")).expect("Cargo.toml is TOML");
    let deb = &manifest["package"]["metadata"]["deb"];
    let assets: Vec<(String, String)> = deb["assets"]
        .as_array()
        .expect("assets")
        .iter()
        .map(|a| {
            (
                a[0].as_str().expect("source").to_owned(),
                a[1].as_str().expect("dest").to_owned(),
            )
        })
        .collect();
    let sources: Vec<&str> = assets.iter().map(|(s, _)| s.as_str()).collect();

    for entry in std::fs::read_dir(repo_file("man")).expect("man/") {
        let name = entry
            .expect("man/ entry")
            .file_name()
            .into_string()
            .expect("UTF-8 name");
        let section = name
            .rsplit('.')
            .next()
            .expect("a section suffix")
            .to_owned();
        let (_, dest) = assets
            .iter()
            .find(|(s, _)| *s == format!("man/{name}"))
            .unwrap_or_else(|| panic!("man/{name} is not in the package's assets"));
        assert_eq!(dest, &format!("usr/share/man/man{section}/"), "man/{name}");
    }
    for (unit, bin) in UNITS {
        assert!(
            sources.contains(&format!("packaging/debian/{unit}").as_str()),
            "{unit} is not packaged"
        );
        assert!(
            sources.contains(&format!("target/release/{bin}").as_str()),
            "{bin} is not packaged"
        );
    }
    assert!(sources.contains(&"target/release/dtf"));
    for (source, _) in &assets {
        // Built files come from cargo; the shipped config from its own branch.
        if source.starts_with("target/")
            || (source == "etc/dtf/dtf.toml" && !repo_file(source).exists())
        {
            continue;
        }
        assert!(repo_file(source).is_file(), "asset {source} does not exist");
    }

    let scripts = deb["maintainer-scripts"]
        .as_str()
        .expect("maintainer-scripts");
    for script in ["postinst", "prerm", "postrm"] {
        let text = read(&format!("{scripts}{script}"));
        assert!(
            text.starts_with("#!/bin/sh\n"),
            "{script}: a POSIX shell script"
        );
        assert!(text.contains("\nset -e\n"), "{script}: set -e");
        // cargo-deb only fills #DEBHELPER# for its own systemd-units support:
        // here it would stay a literal comment.
        assert!(
            !text.contains("#DEBHELPER#"),
            "{script}: #DEBHELPER# would not be expanded"
        );
    }
}

#[test]
fn the_evaluator_runs_below_training() {
    let values = unit_values(&read("packaging/debian/dtf-evaluator.service"));
    let one = |k: &str| -> i64 {
        values[k]
            .last()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("dtf-evaluator.service: {k}="))
    };
    // systemd's default CPUWeight= is 100, Nice= 0; the training units set neither.
    assert!(one("CPUWeight") < 100);
    assert!(one("Nice") > 0);
    for (unit, _) in &UNITS[..2] {
        let training = unit_values(&read(&format!("packaging/debian/{unit}")));
        assert!(!training.contains_key("CPUWeight") && !training.contains_key("Nice"));
    }
    let target = read("packaging/debian/dtf.target");
    let unit = read("packaging/debian/dtf-evaluator.service");
    assert!(unit.contains("\nPartOf=dtf.target\n") && target.contains("dtf-evaluator"));
}

#[test]
fn units_raise_the_descriptor_limit() {
    // The default soft limit of 1024 is what an idle-connection flood
    // exhausted first (issue 15); the ps caps connections well below this.
    // The evaluator serves only its metrics: the default is plenty.
    for (unit, _) in UNITS.iter().filter(|(_, bin)| *bin != "dtf-evaluator") {
        let values = unit_values(&read(&format!("packaging/debian/{unit}")));
        let limit: Vec<u64> = values
            .get("LimitNOFILE")
            .into_iter()
            .flatten()
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|e| panic!("{unit}: LimitNOFILE={v}: {e}"))
            })
            .collect();
        assert_eq!(limit.len(), 1, "{unit}: one LimitNOFILE=, got {limit:?}");
        assert!(
            limit[0] >= 4 * dtf::ps::limits::MAX_CONNECTIONS as u64,
            "{unit}: LimitNOFILE={} leaves no room above the connection cap",
            limit[0]
        );
    }
}
