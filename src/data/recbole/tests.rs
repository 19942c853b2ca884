use super::*;
use crate::data::Batch;

/// A data set directory with these files.
fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(d.path().join(name), text).unwrap();
    }
    d
}

fn cfg(d: &tempfile::TempDir, threshold: Option<f64>) -> DataConfig {
    DataConfig {
        format: crate::config::DataFormat::Recbole,
        dir: d.path().to_path_buf(),
        label: "rating".into(),
        threshold,
        ..DataConfig::default()
    }
}

const INTER: &str = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n\
                     1\t10\t5\t100\n\
                     2\t10\t3\t200\n\
                     1\t11\t4\t300\n\
                     3\t12\t1\t400\n";
const USER: &str = "user_id:token\tage:token\tgender:token\n1\t24\tM\n2\t53\tF\n";
const ITEM: &str = "item_id:token\tclass:token_seq\tyear:float\n\
                    10\tAction Comedy\t1995\n11\t\t1990\n12\tDrama\t\n";

/// Every example of one split, as a batch.
fn all(ds: &Dataset) -> Batch {
    let mut b = Batch::default();
    let rows: Vec<usize> = (0..ds.len()).collect();
    ds.fill_batch(&rows, &mut b);
    b
}

#[test]
fn inter_is_joined_with_users_and_items_and_thresholded() {
    let d = dir(&[
        ("toy.train.inter", INTER),
        ("toy.test.inter", INTER),
        ("toy.user", USER),
        ("toy.item", ITEM),
    ]);
    let (train, test) = load_both(&cfg(&d, Some(4.0))).unwrap();
    assert_eq!((train.len(), test.len()), (4, 4));
    assert_eq!(train.labels(), [1, 0, 1, 0], "rating >= 4");
    assert_eq!(train.names().unwrap(), ["timestamp", "year"]);
    let c = train.categorical().unwrap();
    assert_eq!(c.fields, ["user_id", "item_id", "age", "gender", "class"]);
    // Row 0: user 1 (24, M), item 10 (Action Comedy).
    assert_eq!(c.get(0, 0), [id("user_id", "1")]);
    assert_eq!(c.get(0, 1), [id("item_id", "10")]);
    assert_eq!(c.get(0, 2), [id("age", "24")]);
    assert_eq!(c.get(0, 4), [id("class", "Action"), id("class", "Comedy")]);
    // Row 2: item 11's class is an empty token_seq: no ids.
    assert_eq!(c.get(2, 4), [] as [u64; 0]);
    // Row 3: user 3 is not in toy.user: each of its fields is the token "".
    assert_eq!(c.get(3, 2), [id("age", "")]);
    assert_eq!(c.get(3, 3), [id("gender", "")]);
    // Dense: timestamp and year, raw until preprocessing; item 12's empty
    // year is 0.
    let b = all(&train);
    assert_eq!(b.x.row(0).to_vec(), [100.0, 1995.0]);
    assert_eq!(b.x.row(3).to_vec(), [400.0, 0.0]);
    assert_eq!(b.y, [1, 0, 1, 0]);
    assert_eq!(b.categorical, *c);
}

#[test]
fn without_side_files_only_the_inter_columns_are_features() {
    let d = dir(&[("toy.inter", INTER)]);
    let mut c = cfg(&d, Some(4.0));
    c.test_fraction = 0.25;
    let (train, test) = load_both(&c).unwrap();
    assert_eq!((train.len(), test.len()), (3, 1));
    assert_eq!(train.categorical().unwrap().fields, ["user_id", "item_id"]);
    // The split is the seeded one, whichever function loads it.
    let t = load(&c, Split::Test).unwrap();
    assert_eq!(all(&t).categorical, all(&test).categorical);
    let (_, rows) = split_rows(4, 0.25);
    assert_eq!(all(&test).x[[0, 0]], 100.0 * (rows[0] + 1) as f32);
}

#[test]
fn without_a_threshold_labels_are_class_indices() {
    let d = dir(&[("toy.inter", INTER)]);
    let (train, test) = load_both(&cfg(&d, None)).unwrap();
    let mut labels: Vec<u8> = train
        .labels()
        .iter()
        .chain(test.labels())
        .copied()
        .collect();
    labels.sort_unstable();
    assert_eq!(labels, [1, 3, 4, 5]);
}

#[test]
fn bad_input_names_file_line_and_column() {
    let h = "user_id:token\trating:float\n";
    let cases: &[(&str, &str, Option<f64>)] = &[
        (
            "u:token\trating:float\n1\t2\t3\n",
            "line 2: 3 fields, the header has 2",
            Some(4.0),
        ),
        (
            "u:token\trating:floaty\n",
            "line 1, column 2: unknown type \"floaty\"",
            None,
        ),
        (
            "u:token\trating:float_seq\n",
            "float_seq is not supported",
            None,
        ),
        (
            "u\trating:float\n",
            "line 1, column 1: \"u\" has no type",
            None,
        ),
        (
            "u:token\trating:float\n1\tfive\n",
            "line 2, column \"rating\": label \"five\" is not a number",
            Some(4.0),
        ),
        (
            "u:token\trating:float\n1\t4.5\n",
            "label \"4.5\" is not a class index",
            None,
        ),
        (
            "u:token\tscore:float\n1\t4\n",
            "no label column \"rating\"",
            Some(4.0),
        ),
        (
            "u:token\trating:float\tt:float\n1\t4\tx\n",
            "line 2, column \"t\": \"x\" is not a finite number",
            Some(4.0),
        ),
        ("", "line 1: no header", None),
        (h, "holds no examples", Some(4.0)),
    ];
    for (text, want, threshold) in cases {
        let d = dir(&[("bad.inter", text)]);
        let msg = load_both(&cfg(&d, *threshold)).unwrap_err().to_string();
        assert!(msg.contains(want), "{text:?}: {msg}");
        assert!(msg.contains("bad.inter"), "names the file: {msg}");
    }
}

#[test]
fn bad_side_files_and_layouts_are_refused() {
    let d = dir(&[("a.inter", INTER), ("a.user", "age:token\n24\n")]);
    let msg = load_both(&cfg(&d, Some(4.0))).unwrap_err().to_string();
    assert!(
        msg.contains("a.user") && msg.contains("no column \"user_id\" to join on"),
        "{msg}"
    );
    let d = dir(&[
        ("a.inter", INTER),
        ("a.user", "user_id:token\tage:token\n1\t2\n1\t3\n"),
    ]);
    let msg = load_both(&cfg(&d, Some(4.0))).unwrap_err().to_string();
    assert!(
        msg.contains("line 3, column \"user_id\"") && msg.contains("twice"),
        "{msg}"
    );
    let d = dir(&[
        ("a.inter", INTER),
        ("a.item", "item_id:token\tuser_id:token\n10\t1\n"),
    ]);
    let msg = load_both(&cfg(&d, Some(4.0))).unwrap_err().to_string();
    assert!(msg.contains("column \"user_id\" is also in"), "{msg}");
    let d = dir(&[("a.inter", INTER), ("b.inter", INTER)]);
    let msg = load_both(&cfg(&d, Some(4.0))).unwrap_err().to_string();
    assert!(
        msg.contains("several data sets (a.inter, b.inter)"),
        "{msg}"
    );
    let d = dir(&[]);
    let msg = load_both(&cfg(&d, Some(4.0))).unwrap_err().to_string();
    assert!(msg.contains("holds no RecBole interaction file"), "{msg}");
    assert!(!is_recbole_dir(d.path()));
}

/// MovieLens-100k, as `scripts/fetch-ml100k.sh` caches it; `None` (with a
/// loud message) when it is absent outside CI, a failure under CI.
pub(crate) fn ml100k_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DTF_ML100K").map_or_else(
        || {
            let cache = std::env::var_os("DTF_TEST_CACHE")
                .map_or_else(|| PathBuf::from("/var/cache/dtf-test"), PathBuf::from);
            cache.join("ml-100k")
        },
        PathBuf::from,
    );
    if dir.join("ml-100k.inter").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{}: MovieLens-100k is missing under CI: scripts/test.sh fetches it with \
         scripts/fetch-ml100k.sh",
        dir.display()
    );
    eprintln!(
        "SKIPPED: {} has no ml-100k.inter: run scripts/fetch-ml100k.sh to test on MovieLens-100k",
        dir.display()
    );
    None
}

#[test]
fn movielens_100k_loads_with_its_users_and_items() {
    let Some(dir) = ml100k_dir() else { return };
    let c = DataConfig {
        format: crate::config::DataFormat::Recbole,
        dir,
        label: "rating".into(),
        threshold: Some(4.0),
        ..DataConfig::default()
    };
    let (train, test) = load_both(&c).unwrap();
    assert_eq!(train.len() + test.len(), 100_000);
    assert_eq!(test.len(), 20_000, "the seeded 80/20 split");
    let cat = train.categorical().unwrap();
    assert_eq!(
        cat.fields,
        [
            "user_id",
            "item_id",
            "age",
            "gender",
            "occupation",
            "zip_code",
            "movie_title",
            "release_year",
            "class"
        ]
    );
    assert_eq!(train.names().unwrap(), ["timestamp"]);
    // 55,375 of MovieLens-100k's ratings are 4 or 5.
    let positives: usize = [&train, &test]
        .iter()
        .map(|d| d.labels().iter().map(|&l| usize::from(l)).sum::<usize>())
        .sum();
    assert_eq!(positives, 55_375);
    // Every user and item of the inter file is in the side files: no "".
    let missing = id("gender", "");
    assert!((0..cat.len()).all(|e| cat.get(e, 3) != [missing]));
}

#[test]
fn dense_features_beside_categorical_ones_are_standardized() {
    let d = dir(&[("toy.inter", INTER)]);
    let mut c = cfg(&d, Some(4.0));
    c.test_fraction = 0.25;
    // data.standardize is false, yet the timestamps are standardized.
    let (train, _) = crate::data::load_both(&c).unwrap();
    let b = all(&train);
    let col: Vec<f32> = b.x.column(0).to_vec();
    let mean = col.iter().sum::<f32>() / col.len() as f32;
    let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / col.len() as f32;
    assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4, "{col:?}");
}

#[test]
fn the_mlp_refuses_categorical_data_rather_than_drop_it() {
    let d = dir(&[("toy.inter", INTER)]);
    let mut config = crate::config::Config {
        data: cfg(&d, Some(4.0)),
        ..Default::default()
    };
    let msg = crate::data::resolve_model(&mut config)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("model.kind")
            && msg.contains("2 categorical fields (user_id, item_id)")
            && msg.contains("wide_deep"),
        "{msg}"
    );
}

#[test]
fn wide_deep_takes_its_input_width_from_the_fields_and_wants_binary_labels() {
    let d = dir(&[("toy.inter", INTER)]);
    let mut config = crate::config::Config {
        data: cfg(&d, Some(4.0)),
        ..Default::default()
    };
    config.model.kind = crate::config::ModelKind::WideDeep;
    config.model.hidden = Some(vec![8]);
    config.model.embedding_dim = 4;
    crate::data::resolve_model(&mut config).unwrap();
    // Two fields of 4 and the dense columns the toy data has.
    let dense = crate::data::load(&config.data, crate::data::Split::Train)
        .unwrap()
        .features();
    assert_eq!(config.model.layers, vec![2 * 4 + dense, 8, 1]);
    config.data.threshold = None;
    config.model.hidden = Some(vec![8]);
    let msg = crate::data::resolve_model(&mut config)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("data.threshold"), "{msg}");
}

#[test]
fn read_all_takes_a_file_or_a_directory_with_or_without_the_label() {
    let unlabelled = "user_id:token\titem_id:token\ttimestamp:float\n1\t11\t500\n9\t10\t600\n";
    let d = dir(&[
        ("toy.train.inter", INTER),
        ("toy.test.inter", INTER),
        ("toy.valid.inter", unlabelled),
        ("toy.user", USER),
        ("toy.item", ITEM),
    ]);
    let c = cfg(&d, Some(4.0));
    // The directory of a split data set: its test file, labelled.
    let test = read_all(d.path(), &c).unwrap();
    assert_eq!(test.labels(), [1, 0, 1, 0]);
    // One file, joined with NAME.user and NAME.item beside it; no label
    // column: every label 0, the features as a labelled file has them.
    let new = read_all(&d.path().join("toy.valid.inter"), &c).unwrap();
    assert_eq!(new.labels(), [0, 0]);
    assert_eq!(new.names().unwrap(), test.names().unwrap());
    let cat = new.categorical().unwrap();
    assert_eq!(cat.fields, test.categorical().unwrap().fields);
    assert_eq!(cat.get(0, 2), [id("age", "24")], "user 1 joined");
    // Training still requires the label.
    let err = read_inter(
        &d.path().join("toy.valid.inter"),
        &Joins { sides: vec![] },
        &c,
    );
    assert!(err.unwrap_err().to_string().contains("no label column"));
}
