//! Text from outside, as the console shows it. The templates (maud) escape markup in every value;
//! [`Shown`] also makes visible what would hide or reorder what a person reads, so every value
//! agents or people wrote goes in as `(shown(&value))`.

use std::fmt::Write;

use maud::{Escaper, Render};

/// `text` as the console shows it: controls, bidi overrides and zero-width characters as
/// `[U+XXXX]`, and markup escaped by the template.
pub struct Shown<'a>(&'a str);

pub fn shown(text: &str) -> Shown<'_> {
    Shown(text)
}

impl Render for Shown<'_> {
    fn render_to(&self, buffer: &mut String) {
        let mut out = Escaper::new(buffer);
        for c in self.0.chars() {
            let _ = match c {
                '\n' | '\t' => out.write_char(c),
                c if hidden(c) => write!(out, "[U+{:04X}]", c as u32),
                c => out.write_char(c),
            };
        }
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

/// A link target from agents' text: only a plain web address becomes a link.
pub fn web_link(url: &str) -> Option<&str> {
    let url = url.trim();
    let plain = (url.starts_with("https://") || url.starts_with("http://"))
        && !url.chars().any(|c| c.is_whitespace() || c.is_control());
    plain.then_some(url)
}

#[cfg(test)]
mod tests {
    use maud::html;

    use super::*;

    fn show(text: &str) -> String {
        html! { (shown(text)) }.into_string()
    }

    #[test]
    fn markup_becomes_text() {
        assert_eq!(show("<script>alert(1)</script>"), "&lt;script&gt;alert(1)&lt;/script&gt;");
        assert_eq!(show(r#"" onmouseover=x a&b"#), "&quot; onmouseover=x a&amp;b");
        assert_eq!(show("&lt;"), "&amp;lt;", "an entity in the text stays text");
        assert_eq!(
            html! { td title=(shown("\"><b>")) { (shown("<b>")) } }.into_string(),
            r#"<td title="&quot;&gt;&lt;b&gt;">&lt;b&gt;</td>"#
        );
        assert_eq!(show("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
    }

    #[test]
    fn hidden_characters_are_shown() {
        assert_eq!(show("a\u{1b}[31mb"), "a[U+001B][31mb");
        assert_eq!(show("file\u{202E}txt.exe"), "file[U+202E]txt.exe");
        assert_eq!(show("zero\u{200B}width\u{FEFF}"), "zero[U+200B]width[U+FEFF]");
        assert_eq!(show("nul\0"), "nul[U+0000]");
        assert_eq!(show("two\nlines\tand a tab"), "two\nlines\tand a tab");
        assert_eq!(show("\r\u{85}"), "[U+000D][U+0085]");
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
