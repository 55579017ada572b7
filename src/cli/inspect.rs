//! `inspect`: a model file's header, geometry, streams and metadata.

use super::args::InspectArgs;
use crate::{out, outln};
use anyhow::Result;

pub(super) fn cmd_inspect(a: InspectArgs) -> Result<()> {
    // A .gguf is inspected through its import in the cache (imported once).
    let f = super::model::open_model(&super::model::resolve_model(Some(a.file))?)?;
    let report = crate::inspect::report(&f);
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        out!("{}", crate::inspect::render(&report))?;
    }
    Ok(())
}
