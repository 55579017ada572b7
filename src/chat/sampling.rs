//! Sampling settings: their defaults (greedy for scripted runs, llama.cpp-like for chat), their
//! validation, the one-line description the header and transcripts show, and the settings a user
//! overrides (`SamplingOverrides`; the command line's flags, `cli::args::SamplingOverrides`, fill it).

use crate::telemetry::SamplingParams;

/// A sampling setting outside its range; the message names the flag / field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSampling(pub String);

/// Defaults for scripted runs (`run`): greedy, so outputs are reproducible without a seed.
pub fn scripted_defaults() -> SamplingParams {
    SamplingParams::default()
}

/// Defaults for chatting (TUI on a chat model, `chat`): greedy decoding makes small models loop,
/// so sample like llama.cpp (temperature 0.7, top-k 40, top-p 0.95, min-p 0.05) with a mild
/// repetition penalty; the seed is fixed, so a conversation replays identically.
pub fn chat_defaults() -> SamplingParams {
    SamplingParams {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.1,
        seed: 0,
    }
}

/// Checks every field's range.
pub fn validate(p: &SamplingParams) -> Result<(), InvalidSampling> {
    let bad = |m: &str| Err(InvalidSampling(m.to_string()));
    if !(p.temperature >= 0.0 && p.temperature.is_finite()) {
        return bad("--temperature must be >= 0");
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return bad("--top-p must be in (0, 1]");
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        return bad("--min-p must be in [0, 1]");
    }
    if !(p.repeat_penalty > 0.0 && p.repeat_penalty.is_finite()) {
        return bad("--repeat-penalty must be > 0");
    }
    Ok(())
}

/// "temp 0.70 top-k 40 top-p 0.95 min-p 0.05 rep 1.10 seed 0", or "greedy" (plus the penalty
/// when it is on, since it changes greedy answers too).
pub fn describe(p: &SamplingParams) -> String {
    let rep = if p.repeat_penalty != 1.0 {
        format!(" rep {:.2}", p.repeat_penalty)
    } else {
        String::new()
    };
    if p.temperature <= 0.0 {
        return format!("greedy{rep}");
    }
    let k = if p.top_k == 0 {
        "off".to_string()
    } else {
        p.top_k.to_string()
    };
    format!(
        "temp {:.2} top-k {k} top-p {:.2} min-p {:.2}{rep} seed {}",
        p.temperature, p.top_p, p.min_p, p.seed
    )
}

/// The exact, machine-readable form transcripts record ("temp 0.7 top-k 40 top-p 0.95 min-p
/// 0.05 rep 1.1 seed 0": every field, shortest decimal that reads back to the same f32), read
/// back by [`parse_spec`].
pub fn spec(p: &SamplingParams) -> String {
    format!(
        "temp {} top-k {} top-p {} min-p {} rep {} seed {}",
        p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.seed
    )
}

/// Reads a [`spec`] (also the [`describe`] form older transcripts hold: "greedy", "top-k off",
/// fields in any order; missing fields take the [`scripted_defaults`]), validated.
pub fn parse_spec(s: &str) -> Result<SamplingParams, InvalidSampling> {
    let mut p = scripted_defaults();
    let mut words = s.split_whitespace();
    let bad = |m: String| Err(InvalidSampling(m));
    while let Some(k) = words.next() {
        if k == "greedy" {
            p.temperature = 0.0;
            continue;
        }
        let Some(v) = words.next() else {
            return bad(format!("`{k}` has no value"));
        };
        let f = |v: &str| {
            v.parse::<f32>()
                .map_err(|_| InvalidSampling(format!("`{k} {v}`: not a number")))
        };
        match k {
            "temp" => p.temperature = f(v)?,
            "top-p" => p.top_p = f(v)?,
            "min-p" => p.min_p = f(v)?,
            "rep" => p.repeat_penalty = f(v)?,
            "top-k" if v == "off" => p.top_k = 0,
            "top-k" => {
                p.top_k = v
                    .parse()
                    .map_err(|_| InvalidSampling(format!("`top-k {v}`: not a count")))?
            }
            "seed" => {
                p.seed = v
                    .parse()
                    .map_err(|_| InvalidSampling(format!("`seed {v}`: not a seed")))?
            }
            _ => {
                return bad(format!(
                    "unknown field `{k}` (expected temp, top-k, top-p, min-p, rep, seed)"
                ))
            }
        }
    }
    validate(&p)?;
    Ok(p)
}

/// The compact form for narrow headers: "T0.7 k40 p0.95 m0.05 r1.1 s0", or "greedy".
pub fn describe_short(p: &SamplingParams) -> String {
    let g = |x: f32| {
        let t = format!("{x:.2}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    let rep = if p.repeat_penalty != 1.0 {
        format!(" r{}", g(p.repeat_penalty))
    } else {
        String::new()
    };
    if p.temperature <= 0.0 {
        return format!("greedy{rep}");
    }
    format!(
        "T{} k{} p{} m{}{rep} s{}",
        g(p.temperature),
        p.top_k,
        g(p.top_p),
        g(p.min_p),
        p.seed
    )
}

/// The sampling settings a user set (the flags of `run`, `chat` and the TUI); unset ones take
/// the defaults of the context ([`scripted_defaults`] for `run`, [`chat_defaults`] for the TUI
/// on a chat model and `chat`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingOverrides {
    pub seed: Option<u64>,
    pub temperature: Option<f32>,
    pub top_k: Option<u32>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
}

impl SamplingOverrides {
    /// The overrides over [`scripted_defaults`].
    pub fn params(&self) -> Result<SamplingParams, InvalidSampling> {
        self.over(scripted_defaults())
    }

    /// The overrides over [`chat_defaults`].
    pub fn chat_params(&self) -> Result<SamplingParams, InvalidSampling> {
        self.over(chat_defaults())
    }

    /// The overrides that are set, over `base`, validated.
    pub fn over(&self, base: SamplingParams) -> Result<SamplingParams, InvalidSampling> {
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(base.repeat_penalty),
            seed: self.seed.unwrap_or(base.seed),
        };
        validate(&p)?;
        Ok(p)
    }
}

/// How the TUI's chat starts: the sampling overrides, a system prompt, and a conversation to
/// continue (the TUI's chat flags).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatStart {
    pub sampling: SamplingOverrides,
    pub system: Option<String>,
    /// A Markdown transcript saved with Ctrl+S.
    pub transcript: Option<std::path::PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_flags_take_the_context_defaults() {
        let none = SamplingOverrides::default();
        assert_eq!(none.params().unwrap(), scripted_defaults());
        assert_eq!(none.chat_params().unwrap(), chat_defaults());
        let some = SamplingOverrides {
            temperature: Some(0.0),
            seed: Some(9),
            ..Default::default()
        };
        let p = some.chat_params().unwrap();
        assert_eq!((p.temperature, p.seed, p.min_p), (0.0, 9, 0.05));
    }

    #[test]
    fn the_spec_reads_back_exactly_and_old_descriptions_read_too() {
        let p = SamplingParams {
            temperature: 0.725,
            top_k: 7,
            top_p: 0.9,
            min_p: 0.033,
            repeat_penalty: 1.15,
            seed: 12345678901,
        };
        assert_eq!(parse_spec(&spec(&p)).unwrap(), p);
        assert_eq!(
            parse_spec(&spec(&chat_defaults())).unwrap(),
            chat_defaults()
        );
        // What older transcripts hold (describe).
        assert_eq!(
            parse_spec(&describe(&chat_defaults())).unwrap(),
            chat_defaults()
        );
        let g = parse_spec("greedy rep 1.10").unwrap();
        assert_eq!((g.temperature, g.repeat_penalty), (0.0, 1.1));
        assert_eq!(parse_spec("temp 1 top-k off").unwrap().top_k, 0);
        for (bad, says) in [
            ("temp", "`temp` has no value"),
            ("temp hot", "not a number"),
            ("top-k -1", "not a count"),
            ("nucleus 0.9", "unknown field `nucleus`"),
            ("top-p 1.5", "--top-p"),
        ] {
            let e = parse_spec(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn ranges_are_checked_and_named() {
        for (a, flag) in [
            (
                SamplingOverrides {
                    temperature: Some(-1.0),
                    ..Default::default()
                },
                "--temperature",
            ),
            (
                SamplingOverrides {
                    top_p: Some(0.0),
                    ..Default::default()
                },
                "--top-p",
            ),
            (
                SamplingOverrides {
                    min_p: Some(1.5),
                    ..Default::default()
                },
                "--min-p",
            ),
            (
                SamplingOverrides {
                    repeat_penalty: Some(f32::NAN),
                    ..Default::default()
                },
                "--repeat-penalty",
            ),
        ] {
            let e = a.params().unwrap_err();
            assert!(e.0.contains(flag), "{e}");
        }
    }

    #[test]
    fn description() {
        assert_eq!(describe(&scripted_defaults()), "greedy");
        assert_eq!(
            describe(&chat_defaults()),
            "temp 0.70 top-k 40 top-p 0.95 min-p 0.05 rep 1.10 seed 0"
        );
        assert_eq!(
            describe_short(&chat_defaults()),
            "T0.7 k40 p0.95 m0.05 r1.1 s0"
        );
    }
}
