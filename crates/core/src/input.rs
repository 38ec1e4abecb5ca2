//! Reading the text files users hand over — schedules, plans, topologies —
//! with a cap, so `/dev/zero` or a mistaken multi-gigabyte file is an error
//! instead of memory growing until the machine gives out.

use std::io::Read;
use std::path::Path;

/// The largest input file read: far above any real schedule, plan or
/// topology file (a 64-rank plan of every collective is a few MiB).
pub const MAX_INPUT_BYTES: u64 = 256 << 20;

/// The file at `path` as text, refused past [`MAX_INPUT_BYTES`] (checked
/// while reading, so endless devices and growing files are caught too).
pub fn read_text(path: &Path) -> std::io::Result<String> {
    read_text_capped(path, MAX_INPUT_BYTES)
}

/// [`read_text`] with a cap of `max` bytes.
pub fn read_text_capped(path: &Path, max: u64) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let too_large = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes, the most an input file may hold"),
        )
    };
    if file.metadata().is_ok_and(|m| m.is_file() && m.len() > max) {
        return Err(too_large());
    }
    let mut text = String::new();
    file.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(too_large());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endless_and_oversized_inputs_are_refused() {
        let err = read_text_capped(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
        let dir = std::env::temp_dir().join(format!("ferrocoll-input-{}", std::process::id()));
        std::fs::write(&dir, "x".repeat(100)).unwrap();
        assert!(read_text_capped(&dir, 99).is_err());
        assert_eq!(read_text_capped(&dir, 100).unwrap().len(), 100);
        std::fs::remove_file(&dir).unwrap();
    }
}
