use super::*;
use reader::detect_delimiter;

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
        assert_eq!(header_names(&path, "label", None).unwrap(), ["a", "b"]);
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
    assert_eq!(detect_delimiter(b"label\n"), b',');
    // A tab-separated header whose names hold a comma stays tab-separated.
    assert_eq!(detect_delimiter(b"price, eur\tqty\tlabel\n"), b'\t');
}

/// A training file's config: `path` with the label column `label`.
fn csv_config(path: &std::path::Path, label: &str) -> DataConfig {
    DataConfig {
        format: crate::config::DataFormat::Csv,
        train: Some(path.to_path_buf()),
        label: label.into(),
        ..DataConfig::default()
    }
}

#[test]
fn class_names_are_classes_in_sorted_order() {
    let (_d, path) =
        write("a,species\n1,virginica\n2,setosa\n3,versicolor\n4,setosa\n5,virginica\n");
    let ds = load_config(&path, &csv_config(&path, "species"), None).unwrap();
    assert_eq!(
        ds.class_names().unwrap(),
        ["setosa", "versicolor", "virginica"]
    );
    assert_eq!(ds.labels(), &[2, 0, 1, 0, 2]);
    // The label column alone gives the same names (a test file read first).
    assert_eq!(
        class_names(&path, &csv_config(&path, "species"))
            .unwrap()
            .unwrap(),
        ["setosa", "versicolor", "virginica"]
    );
    // Integers 0–255 stay class indices, with no names.
    let (_d, path) = write("a,label\n1,3\n2,0\n");
    let ds = load_config(&path, &csv_config(&path, "label"), None).unwrap();
    assert_eq!((ds.labels(), ds.class_names()), (&[3u8, 0][..], None));
    assert_eq!(
        class_names(&path, &csv_config(&path, "label")).unwrap(),
        None
    );
    // Numbers that are not class indices are not names: a threshold is meant.
    let (_d, path) = write("a,label\n1,3\n2,-1\n");
    let err = load_config(&path, &csv_config(&path, "label"), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 3, column \"label\": label \"-1\" is not a class index"),
        "{err}"
    );
    // Integers beside names are names too, sorted as text.
    let (_d, path) = write("a,label\n1,7\n2,cat\n3,10\n");
    let ds = load_config(&path, &csv_config(&path, "label"), None).unwrap();
    assert_eq!(ds.class_names().unwrap(), ["10", "7", "cat"]);
    assert_eq!(ds.labels(), &[1, 2, 0]);
}

#[test]
fn a_test_file_takes_the_training_files_names() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("iris_train.csv");
    let test = dir.path().join("iris_test.csv");
    std::fs::write(&train, "a,species\n1,virginica\n2,setosa\n3,versicolor\n").unwrap();
    // The test file lacks a class and orders them otherwise: the indices
    // are still the training file's.
    std::fs::write(&test, "a,species\n1,virginica\n2,virginica\n3,versicolor\n").unwrap();
    let cfg = DataConfig {
        test: Some(test.clone()),
        ..csv_config(&train, "species")
    };
    let (tr, te) = crate::data::load_both(&cfg).unwrap();
    assert_eq!(te.labels(), &[2, 2, 1]);
    assert_eq!(te.class_names(), tr.class_names());
    // Read alone (the chief's final evaluation): the same indices.
    let alone = crate::data::load(&cfg, crate::data::Split::Test).unwrap();
    assert_eq!(alone.labels(), &[2, 2, 1]);
    // A name training never saw: the file, the line and the name.
    std::fs::write(&test, "a,species\n1,setosa\n2,iris-x\n").unwrap();
    for err in [
        crate::data::load_both(&cfg).unwrap_err(),
        crate::data::load(&cfg, crate::data::Split::Test).unwrap_err(),
    ] {
        let err = err.to_string();
        assert!(
            err.contains("iris_test.csv")
                && err.contains("line 3")
                && err.contains("label \"iris-x\" is not one of the 3 class names"),
            "{err}"
        );
    }
    // With a threshold, names are refused with the reason.
    let cfg = DataConfig {
        threshold: Some(1.0),
        ..cfg
    };
    let err = crate::data::load_both(&cfg).unwrap_err().to_string();
    assert!(
        err.contains("label \"virginica\" is not a number")
            && err.contains("leave data.threshold unset"),
        "{err}"
    );
}

#[test]
fn more_than_256_class_names_are_refused() {
    let mut text = String::from("a,label\n");
    for i in 0..257 {
        text.push_str(&format!("{i},name{i}\n"));
    }
    let (_d, path) = write(&text);
    let err = load_config(&path, &csv_config(&path, "label"), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 258") && err.contains("more than 256 distinct class names"),
        "{err}"
    );
    // 256 are fine.
    let cut: String = text.lines().take(257).map(|l| format!("{l}\n")).collect();
    let (_d, path) = write(&cut);
    let ds = load_config(&path, &csv_config(&path, "label"), None).unwrap();
    assert_eq!(ds.class_names().unwrap().len(), 256);
}

#[test]
fn the_delimiter_key_splits_cells_at_its_character() {
    let (_d, path) = write("a|b|label\n1|2.5|0\n3|-4|1\n");
    let cfg = DataConfig {
        delimiter: "|".into(),
        ..csv_config(&path, "label")
    };
    let ds = load_config(&path, &cfg, None).unwrap();
    assert_eq!(ds.values, Features::Floats(vec![1.0, 2.5, 3.0, -4.0]));
    assert_eq!(ds.names().unwrap(), ["a", "b"]);
    assert_eq!(
        header_names(&path, "label", Some(b'|')).unwrap(),
        ["a", "b"]
    );
    // Told from the header line, the pipes are part of one column's name.
    let err = load_config(&path, &csv_config(&path, "label"), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no column \"label\""), "{err}");
    // A named delimiter wins over the header line's commas.
    let (_d, path) = write("a,x;b;label\n1;2;0\n");
    let cfg = DataConfig {
        delimiter: ";".into(),
        ..csv_config(&path, "label")
    };
    let ds = load_config(&path, &cfg, None).unwrap();
    assert_eq!(ds.names().unwrap(), ["a,x", "b"]);
}

#[test]
fn with_regression_the_label_column_is_read_as_values() {
    use crate::config::ModelTask;
    use crate::data::{Split, load_both_task, load_task};
    use crate::model::Targets;
    let (_d, path) = write("a,b,price\n1,2,1.5\n3,4,-2.25\n5,6,7\n");
    let dir = tempfile::tempdir().unwrap();
    let test = dir.path().join("test.csv");
    std::fs::write(&test, "price,b,a\n0.125,1,2\n").unwrap();
    let cfg = DataConfig {
        test: Some(test.clone()),
        ..csv_config(&path, "price")
    };
    let ds = load_task(&cfg, ModelTask::Regression, Split::Train).unwrap();
    assert_eq!(ds.targets(), Targets::Values(&[1.5, -2.25, 7.0]));
    assert!(ds.is_regression());
    assert_eq!(ds.labels(), &[0, 0, 0], "one output, as one class");
    // The test file (alone, as the chief reads it; and beside its training file).
    let alone = load_task(&cfg, ModelTask::Regression, Split::Test).unwrap();
    assert_eq!(alone.targets(), Targets::Values(&[0.125]));
    let (train, te) = load_both_task(&cfg, ModelTask::Regression).unwrap();
    assert_eq!(te.targets(), Targets::Values(&[0.125]));
    assert_eq!(crate::data::shape(&train, &te).classes, 1);
    // Selected rows keep their values (the seeded split of a file alone).
    assert_eq!(ds.select(&[2, 0]).targets(), Targets::Values(&[7.0, 1.5]));
    // Classification refuses the same column, and says which key reads it.
    let err = load_task(&cfg, ModelTask::Classification, Split::Train)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 2, column \"price\": label \"1.5\" is not a class index")
            && err.contains("model.task = \"regression\""),
        "{err}"
    );
}

#[test]
fn a_regression_label_that_is_not_a_finite_number_names_file_line_and_column() {
    use crate::config::ModelTask;
    use crate::data::{Split, load_task};
    for bad in ["inf", "NaN", "cheap", ""] {
        let (_d, path) = write(&format!("a,price\n1,2.5\n2,{bad}\n"));
        let cfg = csv_config(&path, "price");
        let err = load_task(&cfg, ModelTask::Regression, Split::Train)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&path.display().to_string())
                && err.contains(&format!("line 3, column \"price\": label \"{bad}\""))
                && err.contains("is not a finite number: model.task = \"regression\""),
            "{bad}: {err}"
        );
    }
}

#[test]
fn a_label_of_non_integer_numbers_is_told_real() {
    let real = |text: &str| {
        let (_d, path) = write(text);
        real_label(&path, &csv_config(&path, "y")).unwrap()
    };
    assert_eq!(real("a,y\n1,3\n2,12.5\n3,7.25\n"), Some("12.5".into()));
    assert_eq!(real("a,y\n1,3\n2,1\n"), None, "class indices");
    assert_eq!(real("a,y\n1,-1\n2,300\n"), None, "integers: threshold them");
    assert_eq!(real("a,y\n1,setosa\n2,1.5\n"), None, "names");
}
