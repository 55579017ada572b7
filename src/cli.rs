//! clap CLI definitions and dispatch.

pub fn main() -> i32 {
    0
}
