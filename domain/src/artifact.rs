//! Files attached to messages: what a name may be, how large a file and a message's files may be,
//! and whether a file is text (redacted as bodies are) or binary (stored as sent).

use sha2::{Digest, Sha256};

use super::redact::{self, Counts};
use super::{Error, Result};

/// The most bytes one file may have, unless the server is set otherwise.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// The largest the file limit may be set: a server holds an upload whole while it checks it.
pub const MAX_FILE_BYTES_SETTING: u64 = 64 * 1024 * 1024;
/// The most bytes all files of one message may have together, unless set otherwise.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 32 * 1024 * 1024;
/// What an account's stored files may hold together (uploads waiting and attachments kept),
/// unless set otherwise.
pub const DEFAULT_ACCOUNT_BYTES: u64 = 1024 * 1024 * 1024;
/// The most files one message carries.
pub const MAX_FILES: usize = 16;
/// The most bytes of a file name.
pub const MAX_NAME_BYTES: usize = 255;
/// How long an upload waits for the send that attaches it.
pub const UPLOAD_KEPT_S: f64 = 3600.0;

/// The limits a server enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub file_bytes: u64,
    pub message_bytes: u64,
    pub account_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            file_bytes: DEFAULT_MAX_FILE_BYTES,
            message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            account_bytes: DEFAULT_ACCOUNT_BYTES,
        }
    }
}

/// A file as a message carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub name: String,
    pub size: u64,
    pub binary: bool,
    /// SHA-256 of the stored content.
    pub sha256: [u8; 32],
    /// Credential spans taken out of a text file.
    pub redacted: u32,
}

impl Attached {
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }
}

/// A file checked and made ready to store: its content as recipients will get it.
#[derive(Debug)]
pub struct Prepared {
    pub attached: Attached,
    pub content: Vec<u8>,
    pub redactions: Counts,
}

/// Checks a file's name: one name, no directories, nothing a terminal or a file system would read
/// as more than a name.
pub fn check_name(name: &str) -> Result<()> {
    if name.trim().is_empty() {
        return Err(Error::invalid("a file needs a name"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::invalid(format!("file name is longer than {MAX_NAME_BYTES} bytes")));
    }
    if name == "." || name == ".." || name.contains(['/', '\\']) {
        return Err(Error::invalid(format!("file name {name:?} is a path: give the name alone")));
    }
    if name.chars().any(hidden) {
        return Err(Error::invalid(format!("file name {name:?} holds control or invisible characters")));
    }
    if name.trim() != name || name.ends_with('.') {
        return Err(Error::invalid(format!("file name {name:?} starts or ends with blanks or ends with a dot")));
    }
    // What Windows reads as more than a name: a stream (`a.txt:s`), a device (`CON`, `nul.txt`),
    // characters its file systems refuse.
    if name.contains([':', '*', '?', '"', '<', '>', '|']) {
        return Err(Error::invalid(format!(
            "file name {name:?} holds a character some systems refuse (: * ? \" < > |)"
        )));
    }
    let stem = name.split('.').next().unwrap_or_default().to_ascii_uppercase();
    let device = matches!(stem.as_str(), "CON" | "PRN" | "AUX" | "NUL")
        || (stem.len() == 4
            && (stem.starts_with("COM") || stem.starts_with("LPT"))
            && stem.as_bytes()[3].is_ascii_digit());
    if device {
        return Err(Error::invalid(format!("file name {name:?} is a device's on Windows")));
    }
    Ok(())
}

/// Controls and the characters that show nothing or turn text around (bidi, zero-width, tags):
/// a name holding one could read as another in a listing or a terminal.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{ad}' | '\u{61c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}')
}

/// Checks what arrived against what the sender read (`size`, `sha256` in lowercase hex), then
/// readies it: text (UTF-8 without NUL) is redacted as a body is, anything else kept as it came.
pub fn prepare(name: &str, size: u64, sha256_hex: &str, data: Vec<u8>, limits: &Limits) -> Result<Prepared> {
    check_name(name)?;
    let max = limits.file_bytes;
    if size > max || data.len() as u64 > max {
        return Err(Error::invalid(format!(
            "{name} is {}; a file may be at most {}: nothing was stored",
            bytes_text(size.max(data.len() as u64)),
            bytes_text(max)
        )));
    }
    if data.len() as u64 != size {
        return Err(Error::invalid(format!(
            "upload of {name} is cut short: {} of {size} bytes arrived; nothing was stored",
            data.len()
        )));
    }
    let arrived = Sha256::digest(&data);
    if !hex::encode(arrived).eq_ignore_ascii_case(sha256_hex.trim()) {
        return Err(Error::invalid(format!(
            "upload of {name} does not match its SHA-256: it changed on its way; nothing was stored"
        )));
    }
    let (content, binary, redactions) = match String::from_utf8(data) {
        Ok(text) if !text.contains('\0') => {
            let redacted = redact::redact(&text);
            (redacted.text.into_string().into_bytes(), false, redacted.counts)
        }
        Ok(text) => (text.into_bytes(), true, Counts::new()),
        Err(not_text) => (not_text.into_bytes(), true, Counts::new()),
    };
    // A binary file is stored as sent, so one holding a credential in its readable runs (an
    // environment dump, a core file) is refused rather than passed on.
    if binary && let Some(kinds) = redact::holds_credential(&String::from_utf8_lossy(&content)) {
        return Err(Error::invalid(format!(
            "{name} is binary and holds what reads as a credential ({}): nothing was stored; send it without",
            kinds.join(", ")
        )));
    }
    let sha256: [u8; 32] = Sha256::digest(&content).into();
    let attached = Attached {
        name: name.to_owned(),
        size: content.len() as u64,
        binary,
        sha256,
        redacted: redactions.values().sum(),
    };
    Ok(Prepared { attached, content, redactions })
}

/// Checks the files one message attaches, by their names and sizes.
pub fn check_message(files: &[Attached], limits: &Limits) -> Result<()> {
    if files.len() > MAX_FILES {
        return Err(Error::invalid(format!("a message may carry at most {MAX_FILES} files, not {}", files.len())));
    }
    let mut names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::invalid(format!(
            "two files are named {}: a message's files need names of their own",
            twice[0]
        )));
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    if total > limits.message_bytes {
        return Err(Error::invalid(format!(
            "the files come to {}; a message may carry at most {}: nothing was sent",
            bytes_text(total),
            bytes_text(limits.message_bytes)
        )));
    }
    Ok(())
}

/// A size as people read it: bytes, KiB or MiB.
pub fn bytes_text(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else if bytes >= KIB {
        format!("{:.1} KiB", bytes as f64 / KIB as f64)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(data: &[u8]) -> String {
        hex::encode(Sha256::digest(data))
    }

    #[test]
    fn a_name_is_one_name_without_directories_or_hidden_characters() {
        for good in ["fix.patch", "build log.txt", "ünïcode.md", ".env.example", "console.log", "com10.txt"] {
            check_name(good).unwrap();
        }
        for bad in [
            "",
            " ",
            ".",
            "..",
            "a/b",
            "..\\up",
            "bell\u{7}",
            "rtl\u{202e}txt",
            " padded",
            "dot.",
            "a.txt:stream",
            "CON",
            "nul.txt",
            "com1.log",
            "x<b>.md",
            &"x".repeat(256),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn text_is_redacted_and_binary_kept_as_it_came() {
        let limits = Limits::default();
        let text = b"token = ghp_abcdefghijklmnopqrstuvwxyz0123456789\nrest\n".to_vec();
        let prepared = prepare("notes.txt", text.len() as u64, &sha(&text), text.clone(), &limits).unwrap();
        assert!(!prepared.attached.binary);
        assert_eq!(prepared.attached.redacted, 1, "{:?}", String::from_utf8_lossy(&prepared.content));
        assert!(!String::from_utf8(prepared.content.clone()).unwrap().contains("ghp_abcdef"));
        assert_eq!(prepared.attached.size, prepared.content.len() as u64, "the stored size is what recipients get");
        assert_eq!(prepared.attached.sha256_hex(), sha(&prepared.content));

        let png = vec![0x89, b'P', b'N', b'G', 0, 0xff, 0xfe];
        let prepared = prepare("shot.png", 7, &sha(&png), png.clone(), &limits).unwrap();
        assert!(prepared.attached.binary);
        assert_eq!(prepared.content, png);
        let nul = b"looks like text\0but is not".to_vec();
        assert!(prepare("x.bin", nul.len() as u64, &sha(&nul), nul, &limits).unwrap().attached.binary);
        let environ = b"HOME=/root\0GITHUB_TOKEN=ghp_R8x2kLq9Vw3ZtN5mYb7Hc1Jd4Fg6Sp0AeXuQ\0".to_vec();
        let refused = prepare("environ", environ.len() as u64, &sha(&environ), environ, &limits).unwrap_err();
        assert!(refused.to_string().contains("binary and holds what reads as a credential"), "{refused}");
    }

    #[test]
    fn a_file_cut_short_changed_or_too_large_is_refused() {
        let limits = Limits { file_bytes: 10, ..Limits::default() };
        let data = b"12345".to_vec();
        let short = prepare("a.txt", 9, &sha(&data), data.clone(), &limits).unwrap_err().to_string();
        assert!(short.contains("cut short: 5 of 9 bytes"), "{short}");
        let changed = prepare("a.txt", 5, &sha(b"other"), data.clone(), &limits).unwrap_err().to_string();
        assert!(changed.contains("SHA-256"), "{changed}");
        let large = prepare("a.txt", 11, &sha(&data), data, &limits).unwrap_err().to_string();
        assert!(large.contains("at most 10 B"), "{large}");
    }

    #[test]
    fn a_message_carries_few_files_of_distinct_names_within_its_limit() {
        let file = |name: &str, size| Attached { name: name.into(), size, binary: true, sha256: [0; 32], redacted: 0 };
        let limits = Limits { message_bytes: 100, ..Limits::default() };
        check_message(&[file("a", 60), file("b", 40)], &limits).unwrap();
        assert!(
            check_message(&[file("a", 60), file("b", 41)], &limits).unwrap_err().to_string().contains("at most 100 B")
        );
        assert!(check_message(&[file("a", 1), file("a", 1)], &limits).unwrap_err().to_string().contains("two files"));
        let many: Vec<Attached> = (0..17).map(|i| file(&i.to_string(), 1)).collect();
        assert!(check_message(&many, &limits).is_err());
    }
}
