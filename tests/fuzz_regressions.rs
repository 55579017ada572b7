//! Regression tests for bugs found by the cargo-fuzz targets (`fuzz/`, docs/RELIABILITY.md).
//!
//! * `hf_import` (issue 10): a pipeline-native `config.json` with `num_experts_per_tok` but no
//!   experts was imported "successfully" into a `.cflow` whose header (top-k 2, 0 experts) the
//!   reader then refused. The importer now ignores MoE keys without experts, and the `.cflow`
//!   writer refuses up front any configuration the reader would reject, so no writer can leave
//!   an unreadable file.
//! * `chat_template` (issue 14): `{% set big = range(0)|list %}… big[::-1] …` panicked inside
//!   minijinja 2.24 (a backwards slice of an empty value indexes out of bounds; `''[::-1]` too);
//!   the bounded slice returns an empty value. And LeakSanitizer: `{% set ns.me = ns %}` made a
//!   reference cycle that was never freed; such an assignment is now refused.
//! * `tokenizer_encode` (issue 14): a 513-byte text of spaces and a few symbols, repeated 128×
//!   (64 KiB) through a table pre-tokenizer regex, took > 10 s per input under AddressSanitizer
//!   on a loaded machine (140 ms in release: two encodes and a decode at ~0.7 µs/byte, the
//!   `tokenizers` crate's own speed). The harness now repeats up to 20 KiB (still past the
//!   16 KiB chunk size); the long text itself must encode in chunks, in time, to the same text.

use cflow::convert::generate::GenSpec;
use cflow::convert::hf::import_hf;
use cflow::format::{CflowFile, CflowWriter};
use cflow::quant::QuantType;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn ref_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference/hf")
        .join(name)
}

/// Copies the reference checkpoint `name` into `dst` with its `config.json` edited by `edit`.
fn checkpoint_with_config(name: &str, dst: &Path, edit: impl FnOnce(&mut Value)) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(ref_dir(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let p = dst.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

fn dir_is_empty(d: &Path) -> bool {
    std::fs::read_dir(d).unwrap().next().is_none()
}

#[test]
fn hf_dense_config_with_stray_moe_keys_imports_to_a_readable_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("pn");
    // What the fuzzer produced: the `num_experts` key lost, `num_experts_per_tok` (2) and
    // `moe_intermediate_size` kept, a dense FFN present.
    checkpoint_with_config("pn_arch2_4_combined", &src, |v| {
        v.as_object_mut().unwrap().remove("num_experts");
    });
    let out = tmp.path().join("out.cflow");
    let cfg = import_hf(&src, &out, QuantType::F32, None, |_, _| {}).expect("import");
    assert_eq!((cfg.n_experts, cfg.top_k, cfg.expert_ffn), (0, 0, 0));
    let f = CflowFile::open(&out).expect("the imported file must open");
    assert_eq!((f.cfg.n_experts, f.cfg.top_k), (0, 0));
    assert!(f.cfg.d_ff > 0);
}

#[test]
fn hf_configs_the_reader_would_refuse_fail_before_writing() {
    type Edit = fn(&mut Value);
    let cases: [(&str, &str, Edit); 4] = [
        // Experts declared as zero and no dense FFN (Mixtral): nothing to compute.
        ("mixtral", "neither a dense FFN nor experts", |v| {
            v["num_local_experts"] = 0.into()
        }),
        ("llama", "rms_eps", |v| v["rms_norm_eps"] = 0.0.into()),
        ("llama", "rope_theta", |v| {
            v["rope_parameters"]["rope_theta"] = (-1.0).into()
        }),
        // Fixed-point: the delay counted against the unrolled depth passed the importer's
        // check, but the file format bounds it by the physical layers.
        ("pn_arch5", "dense_delay", |v| v["dense_delay"] = 3.into()),
    ];
    for (model, want, edit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join(model);
        checkpoint_with_config(model, &src, edit);
        let outdir = tmp.path().join("out");
        std::fs::create_dir(&outdir).unwrap();
        let r = import_hf(
            &src,
            &outdir.join("m.cflow"),
            QuantType::F32,
            None,
            |_, _| {},
        );
        let e = r.expect_err(model).to_string();
        assert!(e.contains(want), "{model}: {e}");
        assert!(dir_is_empty(&outdir), "{model}: output left behind");
    }
}

#[test]
fn writer_refuses_a_config_the_reader_would_reject() {
    let good = GenSpec::new("arch2_4_combined").config().unwrap();
    let mut bad = Vec::new();
    let mut c = good.clone();
    c.top_k = c.n_experts + 1;
    bad.push(("top_k", c));
    let mut c = good.clone();
    c.d_model = 48; // not a multiple of the 32-wide block
    bad.push(("d_model", c));
    let mut c = good.clone();
    c.n_layers = 70_000; // does not fit the header's u16 (and exceeds the reader's bound)
    bad.push(("n_layers", c));
    let mut c = good.clone();
    c.dense_delay = 256; // truncated by the header's u8
    bad.push(("dense_delay", c));
    for (what, cfg) in bad {
        let tmp = tempfile::tempdir().unwrap();
        let r = CflowWriter::create(&tmp.path().join("m.cflow"), &cfg);
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"))
            .to_string();
        assert!(
            e.contains(what) || e.contains("does not fit"),
            "{what}: {e}"
        );
        assert!(dir_is_empty(tmp.path()), "{what}: a file was created");
    }
    let tmp = tempfile::tempdir().unwrap();
    assert!(CflowWriter::create(&tmp.path().join("m.cflow"), &good).is_ok());
}

#[test]
fn tokenizer_long_whitespace_text_encodes_in_chunks_in_time() {
    use cflow::chat::tokenizer::{TokenizerWrap, CHUNK_BYTES};
    let input = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/fuzz/tokenizer_encode_timeout_64k_spaces"
    ))
    .unwrap();
    // Harness layout: mode byte, selector byte, `regex \0 text` (the regex is empty here).
    let (sel, rest) = (input[1], &input[2..]);
    let text = std::str::from_utf8(&rest[rest.iter().position(|&b| b == 0).unwrap() + 1..])
        .unwrap()
        .repeat(1 << (sel >> 5));
    assert!(text.len() > 3 * CHUNK_BYTES);
    let known = cflow::convert::gguf_tokenizer::known_pre_tokenizer_regexes();
    let mut doc: Value =
        serde_json::from_str(cflow::chat::bundled_gpt2_tokenizer().unwrap()).unwrap();
    for re in [
        known[sel as usize % known.len()],
        known[0],
        known[known.len() - 1],
    ] {
        doc["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
             "use_regex": false}]});
        let t = TokenizerWrap::from_json(&doc.to_string(), None).unwrap();
        let t0 = std::time::Instant::now();
        let ids = t.encode(&text, false).unwrap();
        let dt = t0.elapsed();
        assert_eq!(t.decode(&ids, false).unwrap(), text, "{re}");
        assert!(dt < std::time::Duration::from_secs(2), "{re}: {dt:?}");
    }
}

#[test]
fn chat_template_backwards_slice_of_an_empty_value_does_not_panic() {
    use cflow::chat::template::{ChatMessage, ChatTemplate};
    let src = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/fuzz/chat_template_crash_backwards_slice_of_empty"
    ))
    .unwrap();
    let src = String::from_utf8_lossy(&src).into_owned();
    let msgs = [ChatMessage::new("user", "hi")];
    if let Ok(t) = ChatTemplate::new(&src, "<s>", "</s>") {
        for gen in [true, false] {
            let _ = t.render(&msgs, gen);
        }
    }
    let t = ChatTemplate::new("[{{ ''[::-1] }}][{{ ([] + [])[::-1]|list }}]", "", "").unwrap();
    assert_eq!(t.render(&msgs, true).unwrap(), "[][[]]");
    let t = ChatTemplate::new("{% set ns = namespace() %}{% set ns.me = [ns] %}x", "", "").unwrap();
    assert!(t
        .render(&msgs, true)
        .unwrap_err()
        .to_string()
        .contains("cycle"));
}

/// The fuzzer's differential oracle (bounded render vs plain minijinja): a slice bound that is
/// an undefined variable (`big[:n:-1]`) was read as omitted by the bounded backwards slice and
/// rendered, where minijinja refuses to convert undefined to an integer. Both refuse now; an
/// omitted bound (`none`) still slices.
#[test]
fn chat_template_undefined_slice_bound_is_refused_like_minijinja() {
    use cflow::chat::template::{render_unbounded_reference, ChatMessage, ChatTemplate};
    let src = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/fuzz/chat_template_crash_undefined_slice_bound"
    ))
    .unwrap();
    let src = String::from_utf8_lossy(&src).into_owned();
    let msgs = [ChatMessage::new("user", "hi")];
    for src in [src.as_str(), "{% set big = [1, 2] %}{{ big[:n:-1] }}"] {
        let Ok(t) = ChatTemplate::new(src, "<s>", "</s>") else {
            continue;
        };
        for gen in [true, false] {
            let ours = t.render(&msgs, gen);
            let theirs = render_unbounded_reference(src, &msgs, gen, "<s>", "</s>");
            assert_eq!(
                ours.is_ok(),
                theirs.is_ok(),
                "{src}: {ours:?} vs {theirs:?}"
            );
        }
    }
    let src = "{{ [1, 2, 3][:0:-1] }}{{ [1, 2, 3][::-1] }}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let ours = t.render(&msgs, true).unwrap();
    assert_eq!(
        ours,
        render_unbounded_reference(src, &msgs, true, "", "").unwrap()
    );
    assert!(ours.ends_with("[3, 2, 1]"), "{ours}");
}
