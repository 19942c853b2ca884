use super::*;

#[test]
fn check_labels_rejects_out_of_range() {
    let ds = Dataset::from_parts(vec![0; 6], vec![1, 9, 3], 2);
    assert!(ds.check_labels(10).is_ok());
    let msg = ds.check_labels(5).unwrap_err().to_string();
    assert!(msg.contains("label 1 is 9"), "{msg}");
}

#[test]
fn batch_scales_pixels_and_reuses_buffer() {
    let ds = Dataset::from_parts(vec![0, 255, 51, 102, 10, 20], vec![4, 7, 1], 2);
    let mut x = Array2::zeros((0, 0));
    let mut y = vec![99];
    ds.batch(&[1, 0], &mut x, &mut y);
    assert_eq!(x, ndarray::array![[0.2, 0.4], [0.0, 1.0]]);
    assert_eq!(y, [7, 4]);
    let ptr = x.as_ptr();
    ds.batch(&[2, 2], &mut x, &mut y);
    assert_eq!(x.as_ptr(), ptr, "same-shape batch must reuse the buffer");
    assert_eq!(x.row(0).to_vec(), [10.0 / 255.0, 20.0 / 255.0]);
    assert_eq!(y, [1, 1]);
    let (all_x, all_y) = ds.all();
    assert_eq!(all_x.dim(), (3, 2));
    assert_eq!(all_x[[0, 1]], 1.0);
    assert_eq!(all_y, [4, 7, 1]);
}
