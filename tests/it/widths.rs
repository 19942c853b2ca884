//! A ps started with `model.hidden` reads no data: the chief, who resolved
//! the widths from the data, sends them (issue 43: "with `model.hidden`, a
//! ps needs the training data to learn the model's shape").

use crate::util::*;
use dtf::config::Mode;
use std::time::Duration;

#[test]
fn a_ps_without_the_data_takes_the_model_s_widths_from_the_chief_again_after_a_kill() {
    let mut c = Cluster::new(2, 2, 1_000_000, Mode::Async);
    c.cfg.ps.snapshot_secs = 1;
    // model.hidden instead of model.layers, in every task's file.
    let hidden = |cfg: &dtf::config::Config| {
        let text: String = cfg
            .to_toml()
            .lines()
            .filter(|l| !l.starts_with("layers ="))
            .map(|l| format!("{l}\n"))
            .collect();
        text.replace("[model]\n", "[model]\nhidden = [16]\n")
    };
    std::fs::write(&c.config_path, hidden(&c.cfg)).unwrap();
    // The ps hosts have no data: their file names a directory that is not there.
    let mut no_data = c.cfg.clone();
    no_data.data.dir = c.dir.path().join("not-here");
    let ps_file = c.dir.path().join("ps.toml");
    std::fs::write(&ps_file, hidden(&no_data)).unwrap();

    // Valid for a ps, saying where its widths come from (today: exit 78,
    // the data set not found).
    let check = run(
        "dtf-ps",
        &[
            "check-config".as_ref(),
            "--config".as_ref(),
            ps_file.as_os_str(),
            "--task".as_ref(),
            "0".as_ref(),
        ],
        &[],
        Duration::from_secs(30),
    );
    assert!(check.status.success(), "{}{}", check.stdout, check.stderr);
    assert!(
        check.stdout.contains("widths") && check.stdout.contains("chief"),
        "{}",
        check.stdout
    );

    for i in 0..2 {
        c.start_as(&format!("ps:{i}"), "ps", i, &ps_file);
    }
    c.wait_log(
        "ps:1",
        "waiting for the chief to send",
        1,
        Duration::from_secs(30),
    );
    c.start("worker", 0);
    c.start("worker", 1);
    for i in 0..2 {
        c.wait_log(
            &format!("ps:{i}"),
            "Took the model's widths",
            1,
            Duration::from_secs(60),
        );
    }
    // Killed once it has a snapshot: started again, it waits for the widths
    // again, then recovers (its snapshot, or the newest checkpoint when that
    // is newer) and the run goes on past where it was.
    let state = c.dir.path().join("state/ps-1");
    until(Duration::from_secs(60), "a snapshot of ps:1", || {
        (!shard_files(&state).is_empty()).then_some(())
    });
    let at_kill = global_step(&c);
    c.kill("ps:1");
    c.start_as("ps:1", "ps", 1, &ps_file);
    c.wait_log(
        "ps:1",
        "Took the model's widths",
        2,
        Duration::from_secs(60),
    );
    past(&c, at_kill + 100);
    // The run goes on, and ends where a reload of both files says: the
    // widths taken stay through a reload.
    let last = global_step(&c) + 5_000;
    c.cfg.train.last_step = last;
    no_data.train.last_step = last;
    std::fs::write(&c.config_path, hidden(&c.cfg)).unwrap();
    std::fs::write(&ps_file, hidden(&no_data)).unwrap();
    c.wait_all_success(Duration::from_secs(300));
    for i in 0..2 {
        assert!(
            c.log(&format!("ps:{i}"))
                .contains("Configuration reloaded.")
        );
    }

    // The model trained has the data's widths around the hidden one.
    let specs = dtf::model::Mlp::new(&[SIDE * SIDE, 16, CLASSES])
        .unwrap()
        .variables();
    let (_, ckpt) = dtf::checkpoint::restore_latest(&c.cfg.checkpoint.dir, &specs)
        .unwrap()
        .expect("a final checkpoint of the data's widths");
    assert_eq!(ckpt.global_step, last);
}
