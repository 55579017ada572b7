//! Teacher-forced evaluation against a reference (`perplexity --kl-divergence`): the
//! reference-logits file format ([`logits_file`]) and the KL-divergence statistics ([`kld`]).

pub mod kld;
pub mod logits_file;
