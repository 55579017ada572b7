//! The sampling and chat flags (`--temperature`, `--top-k`, …, `--system`, `--transcript`),
//! flattened into the TUI's top level, `run` and `chat`; they fill `chat::sampling`'s plain
//! settings, which hold the defaults and the validation.

use crate::chat::sampling::{ChatStart, InvalidSampling, SamplingOverrides};
use crate::telemetry::SamplingParams;
use clap::Args;

/// The sampling flags. Unset flags take the defaults of the context (greedy for `run`,
/// llama.cpp-like for the TUI on a chat model and `chat`: `chat::sampling`).
#[derive(Args, Debug, Clone, Default, PartialEq)]
#[command(next_help_heading = "Sampling")]
pub struct SamplingArgs {
    /// Random seed for sampling [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Sampling temperature; 0 = greedy [default: 0 for `run`; 0.7 for chat: the TUI on a chat
    /// model and `chat`].
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Keep the K most likely tokens (0 = all) [default: 40].
    #[arg(long)]
    pub top_k: Option<u32>,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches P
    /// [default: 0.95].
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Keep tokens at least P times as likely as the most likely one (0 = off) [default: 0 for
    /// `run`; 0.05 for chat].
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Repetition penalty over the last 64 tokens (1 = off) [default: 1 for `run`; 1.1 for
    /// chat].
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
}

impl SamplingArgs {
    /// The flags as the settings they override.
    pub fn overrides(&self) -> SamplingOverrides {
        SamplingOverrides {
            seed: self.seed,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
        }
    }

    /// The flags over the scripted (greedy) defaults.
    pub fn params(&self) -> Result<SamplingParams, InvalidSampling> {
        self.overrides().params()
    }

    /// The flags over the chat defaults.
    pub fn chat_params(&self) -> Result<SamplingParams, InvalidSampling> {
        self.overrides().chat_params()
    }
}

/// The TUI's chat flags besides sampling.
#[derive(Args, Debug, Clone, Default, PartialEq)]
#[command(next_help_heading = "Chat")]
pub struct TuiChatArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System prompt for the chat template (editable in the TUI: o, then the `system` row).
    #[arg(long)]
    pub system: Option<String>,
    /// Continue a conversation saved with Ctrl+S (a Markdown transcript).
    #[arg(long, value_name = "FILE")]
    pub transcript: Option<std::path::PathBuf>,
}

impl TuiChatArgs {
    /// The flags as the TUI's chat start.
    pub fn start(&self) -> ChatStart {
        ChatStart {
            sampling: self.sampling.overrides(),
            system: self.system.clone(),
            transcript: self.transcript.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        chat: TuiChatArgs,
    }

    /// Every flag lands in the field of its name, and unset ones stay unset.
    #[test]
    fn flags_fill_their_overrides() {
        let c = Cli::try_parse_from([
            "x",
            "--seed",
            "3",
            "--temperature",
            "0.5",
            "--top-k",
            "7",
            "--top-p",
            "0.9",
            "--min-p",
            "0.1",
            "--repeat-penalty",
            "1.2",
            "--system",
            "be brief",
        ])
        .unwrap();
        let s = c.chat.start();
        assert_eq!(
            s.sampling,
            SamplingOverrides {
                seed: Some(3),
                temperature: Some(0.5),
                top_k: Some(7),
                top_p: Some(0.9),
                min_p: Some(0.1),
                repeat_penalty: Some(1.2),
            }
        );
        assert_eq!(
            (s.system.as_deref(), s.transcript),
            (Some("be brief"), None)
        );
        let none = Cli::try_parse_from(["x"]).unwrap().chat.start();
        assert_eq!(none, ChatStart::default());
        // A negative value reaches the range check, which names the flag (clap alone would
        // take `-1` for an unknown flag).
        let neg = Cli::try_parse_from(["x", "--temperature", "-1"]).unwrap();
        let e = neg.chat.sampling.params().unwrap_err().to_string();
        assert!(e.contains("--temperature must be >= 0"), "{e}");
    }
}
