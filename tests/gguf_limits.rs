//! GGUF import limits (issue 14, items 9, 12 and 13): every metadata number that sizes an
//! allocation or indexes an array is validated before anything is written, with an error naming
//! the GGUF key; F16/F32 imports take any width while block types refuse a width that is not a
//! multiple of 32 before writing; the GGUF is memory-mapped and its parsed metadata is bounded,
//! so crafted or non-regular inputs (`/dev/zero`) are refused instead of eating all memory.

#[path = "common/gguf_writer.rs"]
mod gguf_writer;

use cflow::convert::gguf::GgufValue;
use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use cflow::engine::{Engine, EngineOptions};
use cflow::format::CflowFile;
use cflow::kernels::Isa;
use cflow::quant::QuantType;
use gguf_writer::{f32_array, str_array, TestGguf, TestTensor};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

const BIN: &str = env!("CARGO_BIN_EXE_cflow-tui");

struct Spec {
    d: usize,
    ff: usize,
    vocab: usize,
    /// Extra or replacing metadata (same key: the later one wins, so they are filtered).
    kvs: Vec<(&'static str, GgufValue)>,
}

fn f32_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2).to_le_bytes()
        })
        .collect()
}

/// A tiny llama-architecture GGUF (1 layer, 4 heads, 2 KV heads, F32 tensors, SentencePiece
/// vocabulary, tied embeddings).
fn tiny_gguf(s: &Spec) -> Vec<u8> {
    let (d, ff, v) = (s.d, s.ff, s.vocab);
    let kvd = d / 2;
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((3..v).map(|i| format!("▁t{i}")));
    let mut kvs: Vec<(String, GgufValue)> = vec![
        (
            "general.architecture".into(),
            GgufValue::String("llama".into()),
        ),
        ("llama.block_count".into(), GgufValue::U32(1)),
        ("llama.embedding_length".into(), GgufValue::U32(d as u32)),
        (
            "llama.feed_forward_length".into(),
            GgufValue::U32(ff as u32),
        ),
        ("llama.attention.head_count".into(), GgufValue::U32(4)),
        ("llama.attention.head_count_kv".into(), GgufValue::U32(2)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            GgufValue::F32(1e-5),
        ),
        ("llama.context_length".into(), GgufValue::U32(256)),
        (
            "tokenizer.ggml.model".into(),
            GgufValue::String("llama".into()),
        ),
        ("tokenizer.ggml.tokens".into(), str_array(&tokens)),
        ("tokenizer.ggml.scores".into(), f32_array(&vec![0.0; v])),
    ];
    for (k, val) in &s.kvs {
        kvs.retain(|(kk, _)| kk != k);
        kvs.push((k.to_string(), val.clone()));
    }
    let mut g = TestGguf::default();
    for (k, val) in kvs {
        g = g.kv(&k, val);
    }
    let mut seed = 1;
    let mut t = |g: TestGguf, name: &str, dims: &[u64]| {
        seed += 1;
        let n = dims.iter().product::<u64>() as usize;
        g.tensor(TestTensor::new(name, dims, 0, f32_bytes(n, seed)))
    };
    let (d64, ff64, v64, kv64) = (d as u64, ff as u64, v as u64, kvd as u64);
    let g = t(g, "token_embd.weight", &[d64, v64]);
    let g = t(g, "blk.0.attn_q.weight", &[d64, d64]);
    let g = t(g, "blk.0.attn_k.weight", &[d64, kv64]);
    let g = t(g, "blk.0.attn_v.weight", &[d64, kv64]);
    let g = t(g, "blk.0.attn_output.weight", &[d64, d64]);
    let g = t(g, "blk.0.attn_norm.weight", &[d64]);
    let g = t(g, "blk.0.ffn_norm.weight", &[d64]);
    let g = t(g, "blk.0.ffn_gate.weight", &[d64, ff64]);
    let g = t(g, "blk.0.ffn_up.weight", &[d64, ff64]);
    let g = t(g, "blk.0.ffn_down.weight", &[ff64, d64]);
    let g = t(g, "output_norm.weight", &[d64]);
    g.write().bytes
}

fn spec() -> Spec {
    Spec {
        d: 64,
        ff: 128,
        vocab: 64,
        kvs: Vec::new(),
    }
}

fn import(dir: &Path, s: &Spec, q: QuantTarget) -> (std::path::PathBuf, Result<(), String>) {
    let src = dir.join("m.gguf");
    std::fs::write(&src, tiny_gguf(s)).unwrap();
    let out = dir.join("m.cflow");
    let _ = std::fs::remove_file(&out);
    let r = import_gguf(&src, &out, q, None, |_, _| {})
        .map(|_| ())
        .map_err(|e| e.to_string());
    (out, r)
}

fn logits(f: &Arc<CflowFile>, isa: Isa) -> Vec<f32> {
    let mut e = Engine::new(
        f.clone(),
        EngineOptions {
            threads: 1,
            isa,
            ..Default::default()
        },
    );
    let mut last = Vec::new();
    for t in [1u32, 5, 9, 3] {
        last = e.step(t, true).unwrap().unwrap().to_vec();
    }
    last
}

/// Item 9: each sizing/indexing key out of range is refused before the output is created, with
/// an error naming the key (before: `rope.dimension_count = 1000` imported, then `run` panicked
/// in engine/ops.rs).
#[test]
fn every_sizing_key_is_validated_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, GgufValue)> = vec![
        ("llama.rope.dimension_count", GgufValue::U32(1000)),
        ("llama.rope.dimension_count", GgufValue::U32(7)),
        ("llama.block_count", GgufValue::U32(5000)),
        ("llama.embedding_length", GgufValue::U32(1 << 21)),
        ("llama.attention.head_count", GgufValue::U32(64)),
        ("llama.feed_forward_length", GgufValue::U32(2_000_000)),
        ("llama.feed_forward_length", GgufValue::U32(0)),
        ("llama.expert_count", GgufValue::U32(300)),
        ("llama.expert_used_count", GgufValue::U32(3)),
        ("llama.context_length", GgufValue::U32(0)),
        ("llama.context_length", GgufValue::U32(u32::MAX)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(0.0),
        ),
        ("llama.rope.freq_base", GgufValue::F32(-1.0)),
    ];
    for (key, val) in cases {
        let mut s = spec();
        s.kvs.push((key, val.clone()));
        let (out, r) = import(dir.path(), &s, QuantTarget::Keep);
        let e = r.expect_err(&format!("{key} = {val:?} was accepted"));
        assert!(e.contains(key), "{key} = {val:?}: {e}");
        assert!(!out.exists(), "{key}: an output was written");
    }
    // A valid rope.dimension_count (partial rotary) still imports and runs.
    let mut s = spec();
    s.kvs
        .push(("llama.rope.dimension_count", GgufValue::U32(8)));
    let (out, r) = import(dir.path(), &s, QuantTarget::Keep);
    r.unwrap();
    let f = Arc::new(CflowFile::open(&out).unwrap());
    assert_eq!(f.cfg.meta.rope_dims, 8);
    assert!(logits(&f, Isa::Scalar).iter().all(|v| v.is_finite()));
}

/// Item 12: an F32 (and F16) import of a width that is not a multiple of 32 runs, with the SIMD
/// kernels agreeing with the scalar ones (before: "tile cols 48 not a multiple of 32" panic);
/// a block type refuses it before writing, naming the key.
#[test]
fn float_imports_take_any_width_block_types_refuse_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec();
    s.ff = 48;
    for q in [QuantTarget::Keep, QuantTarget::To(QuantType::F16)] {
        let (out, r) = import(dir.path(), &s, q);
        r.unwrap();
        let f = Arc::new(CflowFile::open(&out).unwrap());
        assert_eq!(f.layers[0].down.as_ref().unwrap().cols, 48);
        let want = logits(&f, Isa::Scalar);
        let got = logits(&f, Isa::detect());
        let norm = want.iter().map(|v| v * v).sum::<f32>().sqrt();
        for (a, b) in want.iter().zip(&got) {
            assert!((a - b).abs() <= 1e-4 * norm + 1e-5, "{q:?}: {a} vs {b}");
        }
        let o = Command::new(BIN)
            .args(["run", "--token-ids", "1,2,3", "-n", "4"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    for q in [QuantType::Q4_0, QuantType::Q8_0] {
        let (out, r) = import(dir.path(), &s, QuantTarget::To(q));
        let e = r.unwrap_err();
        assert!(
            e.contains("llama.feed_forward_length") && e.contains("multiple of 32"),
            "{e}"
        );
        assert!(!out.exists());
    }
}

/// Runs `cmd` under a 1 GiB address-space limit (so a runaway allocation fails fast instead of
/// taking the machine's memory) with a timeout; returns (exit code, stderr).
fn limited(args: &[&str]) -> (Option<i32>, String) {
    use std::os::unix::process::ExitStatusExt;
    let mut sh = String::from("ulimit -v 1048576 || exit 99; exec \"$0\"");
    for i in 1..=args.len() {
        sh.push_str(&format!(" \"${i}\""));
    }
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(sh)
        .arg(BIN)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("{args:?} still running after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_ne!(status.code(), Some(99), "ulimit -v failed");
    assert_eq!(status.signal(), None, "{args:?} died by a signal: {err}");
    (status.code(), err)
}

/// Item 13: `import /dev/zero` and `perplexity --file /dev/zero` grew until out of memory; a
/// FIFO hung. Now each is refused at once, naming the file.
#[test]
fn non_regular_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("z.cflow");
    let (code, err) = limited(&["import", "/dev/zero", "-o", out.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("/dev/zero") && err.contains("not a regular file"),
        "{err}"
    );
    assert!(!out.exists());

    let m = dir.path().join("m.cflow");
    let o = Command::new(BIN)
        .args([
            "gen", "--arch", "llama", "--layers", "1", "--hidden", "64", "--vocab", "300",
        ])
        .arg("-o")
        .arg(&m)
        .output()
        .unwrap();
    assert!(o.status.success());
    let (code, err) = limited(&["perplexity", m.to_str().unwrap(), "--file", "/dev/zero"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("/dev/zero") && err.contains("not a regular file"),
        "{err}"
    );

    let fifo = dir.path().join("fifo.gguf");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let (code, err) = limited(&[
        "import",
        fifo.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("FIFO"), "{err}");

    // perplexity --file is also bounded in size (sparse 65 MiB file: no disk used).
    let big = dir.path().join("big.txt");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(65 << 20)
        .unwrap();
    let (code, err) = limited(&[
        "perplexity",
        m.to_str().unwrap(),
        "--file",
        big.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("big.txt") && err.contains("MiB"), "{err}");
}

/// Item 13: 100 MB of `u8`-array metadata took 3.2 GB of memory before the import failed. Now the
/// parsed metadata is bounded: under a 1 GiB address-space limit the import fails cleanly
/// (exit 1, the key named), where it used to abort on a failed allocation.
#[test]
fn huge_metadata_arrays_are_refused_with_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("huge.gguf");
    let n: u64 = 100_000_000;
    let key = "general.huge";
    let mut b = Vec::with_capacity(n as usize + 64);
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&1u64.to_le_bytes()); // kvs
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&0u32.to_le_bytes()); // of u8
    b.extend_from_slice(&n.to_le_bytes());
    b.resize(b.len() + n as usize, 7);
    std::fs::write(&p, &b).unwrap();
    drop(b);
    let out = dir.path().join("x.cflow");
    let (code, err) = limited(&["import", p.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(key) && err.contains("metadata too large"),
        "{err}"
    );
    // In-process the same file fails the same way (and the parse maps, not reads, the file).
    let e = cflow::convert::gguf::GgufFile::open(&p).unwrap_err();
    assert!(e.to_string().contains("metadata too large"), "{e}");
}
