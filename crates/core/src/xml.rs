//! The one XML reader of the project: the subset NCCL's topology dumps
//! and MSCCL's algorithm files use — elements with attributes,
//! self-closing tags, comments, an optional declaration, either quote and
//! the predefined and numeric entities — with line numbers for errors.
//! The topology crate turns the tree into a topology, and
//! [`crate::schedule::msccl`] into a schedule.
//!
//! Invariants: nesting is bounded ([`MAX_DEPTH`]), so walking a parsed
//! tree recursively cannot overflow the stack; text between elements is
//! ignored; every error names a line and an element.

use crate::error::XmlError;

fn xml_error(line: usize, element: &str, message: impl Into<String>) -> XmlError {
    XmlError {
        line,
        element: element.to_string(),
        message: message.into(),
    }
}

/// How deep elements may nest. NCCL's own reader stops at the same depth
/// (`NCCL_TOPO_XML_DEPTH_MAX`); the limit also bounds the recursion that
/// walks the tree.
pub const MAX_DEPTH: usize = 256;

/// The element name reported for problems outside any element.
pub const DOCUMENT: &str = "document";

/// One element of the XML tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Element {
    /// The tag name.
    pub name: String,
    /// Attributes in document order, entities decoded; keys are unique.
    pub attrs: Vec<(String, String)>,
    /// Child elements in document order.
    pub children: Vec<Element>,
    /// Line of the start tag's `<`.
    pub line: usize,
}

impl Element {
    /// The value of attribute `key`, if present.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The children whose tag is `name`, in document order.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }
}

/// A cursor over the text that knows its line.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    /// Move `bytes` forward (always to a char boundary), counting lines.
    fn advance(&mut self, bytes: usize) {
        let end = (self.pos + bytes).min(self.text.len());
        self.line += self.text[self.pos..end].matches('\n').count();
        self.pos = end;
    }

    fn skip_whitespace(&mut self) {
        let n = self.rest().len() - self.rest().trim_start().len();
        self.advance(n);
    }

    /// Move past the next `end`, returning what came before it; `None`
    /// (and no move) when `end` never comes.
    fn take_through(&mut self, end: &str) -> Option<&'a str> {
        let at = self.rest().find(end)?;
        let before = &self.rest()[..at];
        self.advance(at + end.len());
        Some(before)
    }

    fn name(&mut self) -> Option<&'a str> {
        let rest = self.rest();
        let first = rest.chars().next()?;
        if !(first.is_alphabetic() || first == '_' || first == ':') {
            return None;
        }
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | ':' | '-' | '.')))
            .unwrap_or(rest.len());
        self.advance(len);
        Some(&rest[..len])
    }
}

/// Replace entity references in an attribute value.
fn decode_entities(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let Some(semi) = after.find(';') else {
            return Err("`&` starts an entity that has no `;`".into());
        };
        let entity = &after[..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .map(|hex| u32::from_str_radix(hex, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse::<u32>))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => out.push(c),
            None => return Err(format!("unknown entity `&{entity};`")),
        }
        rest = &after[semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Read a start tag after its `<`: the name, the attributes, and whether
/// it closes itself.
fn start_tag(cur: &mut Cursor<'_>, line: usize) -> Result<(Element, bool), XmlError> {
    let Some(name) = cur.name() else {
        let what: String = cur.rest().chars().take(12).collect();
        return Err(xml_error(
            cur.line,
            DOCUMENT,
            format!("`<` is not followed by an element name (found `{what}`)"),
        ));
    };
    let mut el = Element {
        name: name.to_string(),
        attrs: Vec::new(),
        children: Vec::new(),
        line,
    };
    // A set, not a scan of the list: an element with a million attributes
    // must not cost a million squared.
    let mut keys: std::collections::HashSet<&str> = std::collections::HashSet::new();
    loop {
        let before = cur.pos;
        cur.skip_whitespace();
        let spaced = cur.pos > before;
        let rest = cur.rest();
        if rest.starts_with("/>") {
            cur.advance(2);
            return Ok((el, true));
        }
        if rest.starts_with('>') {
            cur.advance(1);
            return Ok((el, false));
        }
        if cur.at_end() {
            return Err(xml_error(
                el.line,
                &el.name,
                "the start tag never ends (no `>` before the end of the input)",
            ));
        }
        let Some(key) = cur.name() else {
            let found = cur.peek().map_or(String::new(), String::from);
            return Err(xml_error(
                cur.line,
                &el.name,
                format!("bad attribute syntax: expected a name, `>` or `/>`, found `{found}`"),
            ));
        };
        if !spaced {
            return Err(xml_error(
                cur.line,
                &el.name,
                format!("bad attribute syntax: attribute `{key}` is not separated by whitespace"),
            ));
        }
        cur.skip_whitespace();
        if cur.peek() != Some('=') {
            return Err(xml_error(
                cur.line,
                &el.name,
                format!("bad attribute syntax: attribute `{key}` has no `=` and value"),
            ));
        }
        cur.advance(1);
        cur.skip_whitespace();
        let quote = match cur.peek() {
            Some(q @ ('"' | '\'')) => q,
            _ => {
                return Err(xml_error(
                    cur.line,
                    &el.name,
                    format!("bad attribute syntax: the value of `{key}` is not in quotes"),
                ));
            }
        };
        let value_line = cur.line;
        cur.advance(1);
        let Some(raw) = cur.take_through(if quote == '"' { "\"" } else { "'" }) else {
            return Err(xml_error(
                value_line,
                &el.name,
                format!("bad attribute syntax: the value of `{key}` is never closed"),
            ));
        };
        if raw.contains('<') {
            return Err(xml_error(
                value_line,
                &el.name,
                format!("bad attribute syntax: the value of `{key}` holds a `<`"),
            ));
        }
        let value = decode_entities(raw)
            .map_err(|m| xml_error(value_line, &el.name, format!("attribute `{key}`: {m}")))?;
        if !keys.insert(key) {
            return Err(xml_error(
                value_line,
                &el.name,
                format!("attribute `{key}` appears twice"),
            ));
        }
        el.attrs.push((key.to_string(), value));
    }
}

/// Parse the text into its root element.
pub fn parse_document(text: &str) -> Result<Element, XmlError> {
    let mut cur = Cursor {
        text: text.strip_prefix('\u{feff}').unwrap_or(text),
        pos: 0,
        line: 1,
    };
    let mut open: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    loop {
        let text_end = cur.rest().find('<').unwrap_or(cur.rest().len());
        let between = &cur.rest()[..text_end];
        if !between.trim().is_empty() {
            match open.last() {
                Some(parent) => tracing::debug!(
                    line = cur.line,
                    element = parent.name.as_str(),
                    "XML: text inside an element; ignored"
                ),
                None => {
                    let mut probe = Cursor {
                        text: cur.text,
                        pos: cur.pos,
                        line: cur.line,
                    };
                    probe.advance(between.len() - between.trim_start().len());
                    return Err(xml_error(
                        probe.line,
                        DOCUMENT,
                        "text outside the root element",
                    ));
                }
            }
        }
        cur.advance(text_end);
        if cur.at_end() {
            break;
        }
        let line = cur.line;
        let rest = cur.rest();
        if rest.starts_with("<?") {
            if cur.take_through("?>").is_none() {
                return Err(xml_error(line, DOCUMENT, "`<?` is never closed by `?>`"));
            }
        } else if rest.starts_with("<!--") {
            cur.advance(4);
            if cur.take_through("-->").is_none() {
                return Err(xml_error(
                    line,
                    DOCUMENT,
                    "a comment is never closed by `-->`",
                ));
            }
        } else if rest.starts_with("<!") {
            return Err(xml_error(
                line,
                DOCUMENT,
                "`<!` markup other than a comment (DOCTYPE, CDATA) is not read",
            ));
        } else if rest.starts_with("</") {
            cur.advance(2);
            let name = cur.name().unwrap_or("").to_string();
            cur.skip_whitespace();
            if cur.peek() != Some('>') {
                return Err(xml_error(
                    line,
                    &name,
                    format!("the end tag `</{name}` is not closed by `>`"),
                ));
            }
            cur.advance(1);
            let Some(el) = open.pop() else {
                return Err(xml_error(
                    line,
                    &name,
                    format!("`</{name}>` closes an element that was never opened"),
                ));
            };
            if el.name != name {
                return Err(xml_error(
                    line,
                    &el.name,
                    format!(
                        "mismatched tag: `</{name}>` closes `<{}>` opened on line {}",
                        el.name, el.line
                    ),
                ));
            }
            attach(el, &mut open, &mut root)?;
        } else {
            if open.is_empty() && root.is_some() {
                return Err(xml_error(line, DOCUMENT, "a second root element"));
            }
            cur.advance(1);
            let (el, closed) = start_tag(&mut cur, line)?;
            if closed {
                attach(el, &mut open, &mut root)?;
            } else if open.len() >= MAX_DEPTH {
                return Err(xml_error(
                    line,
                    &el.name,
                    format!("elements nest deeper than {MAX_DEPTH} levels"),
                ));
            } else {
                open.push(el);
            }
        }
    }
    if let Some(el) = open.last() {
        return Err(xml_error(
            el.line,
            &el.name,
            format!(
                "unclosed element: `<{}>` opened on line {} is never closed (the input ends on \
                 line {})",
                el.name, el.line, cur.line
            ),
        ));
    }
    root.ok_or_else(|| xml_error(cur.line, DOCUMENT, "no root element: the input is empty"))
}

/// Hand a finished element to its parent, or make it the root.
fn attach(el: Element, open: &mut [Element], root: &mut Option<Element>) -> Result<(), XmlError> {
    match open.last_mut() {
        Some(parent) => parent.children.push(el),
        None if root.is_none() => *root = Some(el),
        None => return Err(xml_error(el.line, &el.name, "a second root element")),
    }
    Ok(())
}
