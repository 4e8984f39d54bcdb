use tensorzip::{compress, decompress, sample, CompressOptions, DType};

#[test]
fn bf16_weights_round_trip_and_compress() {
    let data = sample::weights(256, 1000, DType::BF16, 1);
    let blob = compress(
        &data,
        DType::BF16,
        &[256, 1000],
        &CompressOptions::default(),
    )
    .unwrap();
    let back = decompress(&blob).unwrap();
    assert_eq!(back.data, data);
    let ratio = blob.len() as f64 / data.len() as f64;
    assert!(ratio < 0.70, "ratio {ratio}");
}

#[test]
fn f32_weights_round_trip_and_compress() {
    let data = sample::weights(300, 777, DType::F32, 2);
    let blob = compress(&data, DType::F32, &[300, 777], &CompressOptions::default()).unwrap();
    let back = decompress(&blob).unwrap();
    assert_eq!(back.data, data);
    let ratio = blob.len() as f64 / data.len() as f64;
    assert!(ratio < 0.86, "ratio {ratio}");
}
