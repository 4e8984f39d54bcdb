//! Development probe: compress every tensor of a safetensors file with options from the command line,
//! optionally cast f32 tensors to bf16/f16, print the total ratio and time.
//! `cargo run --release --example measure -- FILE [fp32|bf16|fp16] [key=value ...]`
use tensorzip::{sample, CompressOptions, CpuEngine, DType};

mod common;
use common::{condition_named, cpu};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let synth = args[1].strip_prefix("synth:").map(|s| s.to_string());
    let bytes = if synth.is_some() {
        Vec::new()
    } else {
        std::fs::read(&args[1]).unwrap()
    };
    let cast = args.get(2).cloned().unwrap_or("fp32".into());
    let mut opts = CompressOptions::default();
    let mut threads = 1;
    for kv in args.iter().skip(3) {
        let (k, v) = kv.split_once('=').unwrap();
        match k {
            "chunk" => opts.chunk_bytes = v.parse().unwrap(),
            "block" => opts.block_units = v.parse().unwrap(),
            "tables" => opts.max_tables = v.parse().unwrap(),
            "sample" => opts.sample_blocks = v.parse().unwrap(),
            "thr" => opts.passthrough_threshold = v.parse().unwrap(),
            "min" => opts.min_compress_bytes = v.parse().unwrap(),
            "threads" => threads = v.parse().unwrap(),
            "cond" => opts.condition = condition_named(v),
            _ => panic!("unknown {k}"),
        }
    }
    let eng = CpuEngine::new(threads).unwrap();
    let mut tensors = Vec::new();
    if let Some(spec) = &synth {
        // synth:ROWSxCOLS
        let (r, c) = spec.split_once('x').unwrap();
        let (r, c): (usize, usize) = (r.parse().unwrap(), c.parse().unwrap());
        let dt = match cast.as_str() {
            "bf16" => DType::BF16,
            "fp16" => DType::F16,
            _ => DType::F32,
        };
        tensors.push((
            "synth".to_string(),
            dt,
            vec![r as u64, c as u64],
            sample::weights(r, c, dt, 7),
        ));
    }
    let st = if synth.is_none() {
        Some(safetensors::SafeTensors::deserialize(&bytes).unwrap())
    } else {
        None
    };
    for (name, view) in st.iter().flat_map(|s| s.tensors()) {
        let dt = DType::from_safetensors_name(&format!("{:?}", view.dtype())).unwrap();
        let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
        let data = view.data().to_vec();
        let to = match cast.as_str() {
            "bf16" => DType::BF16,
            "fp16" => DType::F16,
            _ => dt,
        };
        let cast = (dt == DType::F32)
            .then(|| sample::cast_f32_bytes(&data, to))
            .flatten();
        let (dt, data) = match cast {
            Some(c) => (to, c),
            None => (dt, data),
        };
        tensors.push((name, dt, shape, data));
    }
    let (mut orig, mut comp) = (0usize, 0usize);
    let verbose = std::env::var_os("V").is_some();
    let mut agg: Vec<(u64, u64, u64, usize)> = vec![(0, 0, 0, 0); 8];
    let (mut ov, mut sel, mut rans, mut raw) = (0, 0, 0, 0);
    let mut tc = 0.0;
    let mut td = 0.0;
    for (_name, dt, shape, data) in &tensors {
        let t = cpu();
        let blob = eng.compress(data, *dt, shape, &opts).unwrap();
        tc += cpu() - t;
        let mut out = vec![0u8; data.len()];
        let reps: usize = std::env::var("REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = cpu();
            eng.decompress_into(&blob, &mut out).unwrap();
            best = best.min(cpu() - t);
        }
        td += best;
        assert!(&out == data, "round trip differs");
        let st = tensorzip::stats::BlobStats::of(&blob).unwrap();
        if std::env::var_os("CTX").is_some() {
            if let Ok(v) = tensorzip::blob::BlobView::parse(&blob) {
                let n: Vec<Vec<u8>> = v
                    .cond
                    .iter()
                    .map(|c| c.iter().map(|x| x.0).collect())
                    .collect();
                if n.iter().any(|x| !x.is_empty()) {
                    println!("{_name}: contexts {:?}", n);
                }
            }
        }
        ov += st.overhead_bytes;
        sel += st.selector_bytes;
        rans += st.rans_bytes;
        raw += st.raw_bytes;
        for (i, p) in st.planes.iter().enumerate() {
            // Conditioned units counted with the coded ones, as before the split.
            agg[i].0 += p.coded_units + p.cond_units;
            agg[i].1 += p.raw_units;
            agg[i].2 += p.const_units;
            agg[i].3 += p.table_bytes;
        }
        if verbose {
            println!(
                "{_name} {:?} {dt} ratio {:.2}% planes {:?}",
                shape,
                blob.len() as f64 / data.len() as f64 * 100.0,
                st.planes
                    .iter()
                    .map(|p| format!("{} t{}", p.summary(), p.tables))
                    .collect::<Vec<_>>()
            );
        }
        orig += data.len();
        comp += blob.len();
    }
    println!("overhead {ov} selectors {sel} rans {rans} raw {raw}; planes (coded, raw, const, table bytes) {:?}", agg.iter().filter(|a| a.0+a.1+a.2>0).collect::<Vec<_>>());
    println!(
        "{cast} ratio {:.3}% ({comp}/{orig}) compress {:.3} GB/s decompress {:.3} GB/s",
        comp as f64 / orig as f64 * 100.0,
        orig as f64 / tc / 1e9,
        orig as f64 / td / 1e9
    );
}
