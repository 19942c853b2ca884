use super::*;

fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.csv");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn byte_columns_stay_bytes_and_floats_make_floats() {
    let (_d, path) = write("label,p1,p2\n3,0,255\n1,7,8\n");
    let ds = load(&path, "label").unwrap();
    assert_eq!(ds.values, Features::Bytes(vec![0, 255, 7, 8]));
    assert_eq!(ds.labels(), &[3, 1]);
    assert_eq!(ds.features(), 2);
    // The label column may be anywhere; a float anywhere makes floats.
    let (_d, path) = write("a,b,y\n1,2.5,0\n3,-4,1\n");
    let ds = load(&path, "y").unwrap();
    assert_eq!(ds.values, Features::Floats(vec![1.0, 2.5, 3.0, -4.0]));
    assert_eq!(ds.labels(), &[0, 1]);
}

#[test]
fn bad_rows_are_refused_with_their_line() {
    let cases = [
        (
            "label,p1\n1,2\n1,2,3\n",
            "line 3: 3 cells, the header has 2",
        ),
        (
            "label,p1\n1,2\n1,abc\n",
            "line 3, column \"p1\": \"abc\" is not",
        ),
        ("label,p1\n1,nan\n", "line 2, column \"p1\": \"nan\" is not"),
        (
            "label,p1\n1,2\n300,2\n",
            "line 3, column \"label\": label \"300\"",
        ),
        ("y,p1\n1,2\n", "no column \"label\""),
        ("label,p1\n", "holds no examples"),
        ("", "no header"),
    ];
    for (text, want) in cases {
        let (_d, path) = write(text);
        let msg = load(&path, "label").unwrap_err().to_string();
        assert!(msg.contains(want), "{text:?}: {msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }
}

#[test]
fn rows_without_labels_for_predict() {
    let (_d, path) = write("p1,p2\n1,2\n3,4\n");
    let rows = read(&path, Some("label"), false).unwrap();
    assert_eq!(rows.labels, None);
    assert_eq!(rows.values, Features::Bytes(vec![1, 2, 3, 4]));
    // With the label column present, it is left out of the features.
    let (_d, path) = write("label,p1,p2\n1,1,2\n");
    let rows = read(&path, Some("label"), false).unwrap();
    assert_eq!(rows.features, 2);
    assert_eq!(rows.labels, Some(vec![1]));
}

fn config(categorical: &[&str], threshold: Option<f64>) -> DataConfig {
    DataConfig {
        categorical: categorical.iter().map(|c| c.to_string()).collect(),
        threshold,
        ..DataConfig::default()
    }
}

#[test]
fn columns_with_words_or_named_are_categorical() {
    let (_d, path) = write("label,age,zip,city\n1,30,02134,Boston\n0,41,94043,\n");
    // "city" has words (and a missing value); "zip" is named.
    let ds = load_config(&path, &config(&["zip"], None), None).unwrap();
    assert_eq!(ds.names().unwrap(), ["age"]);
    assert_eq!(ds.values, Features::Bytes(vec![30, 41]));
    let c = ds.categorical().unwrap();
    assert_eq!(c.fields, ["zip", "city"]);
    assert_eq!(
        c.get(0, 0),
        [id("zip", "02134")],
        "the text, not the number 2134"
    );
    assert_eq!(c.get(0, 1), [id("city", "Boston")]);
    assert_eq!(c.get(1, 1), [id("city", "")], "missing: the token \"\"");
    // Without data.categorical only the column with words is.
    let ds = load_config(&path, &config(&[], None), None).unwrap();
    assert_eq!(ds.categorical().unwrap().fields, ["city"]);
    assert_eq!(ds.names().unwrap(), ["age", "zip"]);
    // All numbers and nothing named: no categorical features.
    let (_d, path) = write("label,a\n1,2\n");
    assert!(
        load_config(&path, &config(&[], None), None)
            .unwrap()
            .categorical()
            .is_none()
    );
}

#[test]
fn a_test_file_is_read_as_its_training_file_was() {
    let (_d, train) = write("y,n,zip\n1,1.5,a1\n0,2.5,b2\n");
    let dir = tempfile::tempdir().unwrap();
    // The test file's zips are all numbers, and its columns in another order.
    let test = dir.path().join("test.csv");
    std::fs::write(&test, "zip,n,y\n123,3.5,1\n").unwrap();
    let mut cfg = config(&[], Some(0.5));
    cfg.label = "y".into();
    let tr = load_config(&train, &cfg, None).unwrap();
    let te = load_config(&test, &cfg, Some(&tr)).unwrap();
    assert_eq!(te.categorical().unwrap().fields, ["zip"]);
    assert_eq!(te.categorical().unwrap().get(0, 0), [id("zip", "123")]);
    assert_eq!(te.values, Features::Floats(vec![3.5]));
    assert_eq!((tr.labels(), te.labels()), (&[1u8, 0][..], &[1u8][..]));
    // A word in a column that was numeric in training is an error.
    std::fs::write(&test, "zip,n,y\n123,x,1\n").unwrap();
    let msg = load_config(&test, &cfg, Some(&tr)).unwrap_err().to_string();
    assert!(
        msg.contains("line 2, column \"n\": \"x\" is not a finite number"),
        "{msg}"
    );
}

#[test]
fn categorical_bad_input_is_refused() {
    let (_d, path) = write("label,a\n1,2\n");
    let msg = load_config(&path, &config(&["zip"], None), None)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("line 1: no column \"zip\" (data.categorical"),
        "{msg}"
    );
    let msg = load_config(&path, &config(&["label"], None), None)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("\"label\" is the label column"), "{msg}");
    let (_d, path) = write("label,a\n1,x\nyes,y\n");
    let msg = load_config(&path, &config(&[], Some(1.0)), None)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("line 3, column \"label\": label \"yes\" is not a number"),
        "{msg}"
    );
    // nan is a number that is refused, not a category.
    let (_d, path) = write("label,a\n1,nan\n");
    let msg = load_config(&path, &config(&[], None), None)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("\"nan\" is not a finite number"), "{msg}");
}

#[test]
fn tabs_and_semicolons_are_read_as_the_header_line_uses_them() {
    let want = |ds: &Dataset| {
        assert_eq!(ds.values, Features::Floats(vec![1.0, 2.5, 3.0, -4.0]));
        assert_eq!(ds.labels(), &[0, 1]);
        assert_eq!(ds.names().unwrap(), ["a", "b"]);
    };
    // A TSV export, and a spreadsheet's CSV where the comma is the decimal
    // point's neighbour: the header line's delimiter wins.
    for text in [
        "a\tb\tlabel\n1\t2.5\t0\n3\t-4\t1\n",
        "a;b;label\n1;2.5;0\n3;-4;1\n",
        "a,b,label\n1,2.5,0\n3,-4,1\n",
    ] {
        let (_d, path) = write(text);
        want(&load(&path, "label").unwrap());
        assert_eq!(header_names(&path, "label").unwrap(), ["a", "b"]);
    }
    // A label column that is not there: the flag to fix it, not only the key.
    let (_d, path) = write("user_id\titem_id\tlabel\n1\t2\t0\n");
    let err = load(&path, "rating").unwrap_err().to_string();
    assert!(
        err.contains("no column \"rating\" among 3 columns"),
        "{err}"
    );
    assert!(err.contains("--label"), "{err}");
    // One column: no delimiter at all.
    assert_eq!(delimiter(b"label\n"), b',');
    // A tab-separated header whose names hold a comma stays tab-separated.
    assert_eq!(delimiter(b"price, eur\tqty\tlabel\n"), b'\t');
}
