use super::*;
use crate::config::test_util::*;

#[test]
fn shipped_config_is_the_default() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/etc/dtf/dtf.toml");
    let text = std::fs::read_to_string(path).unwrap();
    assert_eq!(
        Config::from_toml_str(&text, path).unwrap(),
        Config::default()
    );
    // Every key is documented, the optional ones commented out.
    for key in leaves(&Config::default()).keys() {
        let field = key.rsplit('.').next().unwrap();
        assert!(
            text.contains(&format!("\n{field} = ")),
            "{key} missing from {path}"
        );
    }
    for key in [
        "replicas_to_aggregate",
        "total_num_replicas",
        "tls_cert",
        "tls_key",
        "tls_ca",
        "hidden",
        "path",
        "train",
        "test",
        "save_secs",
        "linear_optimizer",
    ] {
        assert!(
            text.contains(&format!("\n# {key} = ")),
            "{key} should be shown commented out"
        );
    }
}

#[test]
fn to_toml_round_trips_and_omits_none() {
    let mut config = Config::from_toml_str(TWO_WORKERS, "f").unwrap();
    let text = config.to_toml();
    assert!(!text.contains("replicas_to_aggregate"), "{text}");
    assert_eq!(Config::from_toml_str(&text, "f").unwrap(), config);
    config.train.replicas_to_aggregate = Some(2);
    config.train.mode = Mode::Sync;
    config.cluster.placement = Placement::Greedy;
    assert_eq!(
        Config::from_toml_str(&config.to_toml(), "f").unwrap(),
        config
    );
}
