//! HTML written by hand. Every value from outside goes through [`escape`] (or its `Display`
//! wrapper [`E`]): agents' text is hostile, and nothing they wrote may become markup.

use std::fmt::{self, Write};

/// `text` made safe as HTML text or a quoted attribute value: markup characters become entities,
/// and characters that hide or reorder what a person reads (controls, bidi overrides, zero-width
/// characters) are shown as `[U+XXXX]`.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    push_escaped(&mut out, text);
    out
}

fn push_escaped(out: &mut impl Write, text: &str) {
    for c in text.chars() {
        let _ = match c {
            '&' => out.write_str("&amp;"),
            '<' => out.write_str("&lt;"),
            '>' => out.write_str("&gt;"),
            '"' => out.write_str("&quot;"),
            '\'' => out.write_str("&#39;"),
            '\n' | '\t' => out.write_char(c),
            c if hidden(c) => write!(out, "[U+{:04X}]", c as u32),
            c => out.write_char(c),
        };
    }
}

/// Characters a reader would not see, or that change how the text around them reads.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}' // zero-width space, joiners, direction marks
            | '\u{202A}'..='\u{202E}' // bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
            | '\u{2066}'..='\u{2069}' // bidi isolates
            | '\u{061C}' | '\u{FEFF}')
}

/// A value written escaped by `format!`: `format!("<td>{}</td>", E(&name))`.
pub struct E<'a>(pub &'a str);

impl fmt::Display for E<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        push_escaped(&mut out, self.0);
        f.write_str(&out)
    }
}

/// A link target from agents' text: only a plain web address becomes a link.
pub fn web_link(url: &str) -> Option<&str> {
    let url = url.trim();
    let plain = (url.starts_with("https://") || url.starts_with("http://"))
        && !url.chars().any(|c| c.is_whitespace() || c.is_control());
    plain.then_some(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_becomes_text() {
        assert_eq!(escape("<script>alert(1)</script>"), "&lt;script&gt;alert(1)&lt;/script&gt;");
        assert_eq!(escape(r#"" onmouseover='x' a&b"#), "&quot; onmouseover=&#39;x&#39; a&amp;b");
        assert_eq!(escape("&lt;"), "&amp;lt;", "an entity in the text stays text");
        assert_eq!(format!("<td>{}</td>", E("<b>")), "<td>&lt;b&gt;</td>");
        assert_eq!(escape("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
    }

    #[test]
    fn hidden_characters_are_shown() {
        assert_eq!(escape("a\u{1b}[31mb"), "a[U+001B][31mb");
        assert_eq!(escape("file\u{202E}txt.exe"), "file[U+202E]txt.exe");
        assert_eq!(escape("zero\u{200B}width\u{FEFF}"), "zero[U+200B]width[U+FEFF]");
        assert_eq!(escape("nul\0"), "nul[U+0000]");
        assert_eq!(escape("two\nlines\tand a tab"), "two\nlines\tand a tab");
        assert_eq!(escape("\r\u{85}"), "[U+000D][U+0085]");
    }

    #[test]
    fn only_web_addresses_become_links() {
        assert_eq!(web_link(" https://forge.example/pull/7 "), Some("https://forge.example/pull/7"));
        assert_eq!(web_link("http://forge.example/x"), Some("http://forge.example/x"));
        assert_eq!(web_link("javascript:alert(1)"), None);
        assert_eq!(web_link("JAVASCRIPT:alert(1)"), None);
        assert_eq!(web_link("data:text/html,x"), None);
        assert_eq!(web_link("https://a b"), None);
    }
}
