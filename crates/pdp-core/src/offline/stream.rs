//! Reading a YAML stream into its documents (cut at its `---` lines when it can be) and writing documents back.

use serde_json::Value;

use super::{Document, OfflineError};

/// The parser's options for `input`, sized so that large inputs are not cut by its defaults.
fn yaml_options(input: &str) -> serde_saphyr::Options {
    // `0755` is octal, as kubectl reads it (file modes are written that way in manifests).
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    // Comments are not kept in values: documents that are written back unchanged keep their text instead.
    options.emit_comments = false;
    if let Some(budget) = options.budget.as_mut() {
        let scale = input.len() / 8 + 1;
        budget.max_documents = budget.max_documents.max(scale);
        budget.max_events = budget.max_events.max(scale * 4);
        budget.max_nodes = budget.max_nodes.max(scale * 2);
        budget.max_depth = 128;
    }
    options
}

/// Whether `line` is a document marker (`---` or `...`, alone or followed by a blank).
fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
}

/// A piece of the stream that holds at most one document.
pub(super) struct Piece<'a> {
    pub(super) text: &'a str,
    /// Lines before it in the stream.
    pub(super) line: usize,
}

/// Cuts a stream at its document markers. YAML forbids `---` and `...` at the start of a line inside a
/// document (in block and quoted scalars too), so each piece holds at most one document. `None` for what this
/// cut does not cover (directives, a byte order mark): the stream is then read whole.
pub(super) fn cut(input: &str) -> Option<Vec<Piece<'_>>> {
    let mut pieces = Vec::new();
    let (mut start, mut start_line) = (0, 0);
    let mut at = 0;
    for (n, line) in input.split_inclusive('\n').enumerate() {
        if line.starts_with(['%', '\u{feff}']) {
            return None;
        }
        let next = at + line.len();
        if is_marker(line, "---") {
            pieces.push(Piece {
                text: &input[start..at],
                line: start_line,
            });
            (start, start_line) = (at, n);
        } else if is_marker(line, "...") {
            pieces.push(Piece {
                text: &input[start..next],
                line: start_line,
            });
            (start, start_line) = (next, n + 1);
        }
        at = next;
    }
    pieces.push(Piece {
        text: &input[start..],
        line: start_line,
    });
    pieces.retain(|p| !p.text.is_empty());
    Some(pieces)
}

/// Whether `text` holds no node: only blank lines, comments and markers (alone or with a comment).
fn is_empty_piece(text: &str) -> bool {
    text.lines().all(|l| {
        let rest = ["---", "..."]
            .iter()
            .find(|m| is_marker(l, m))
            .map_or(l, |m| &l[m.len()..])
            .trim();
        rest.is_empty() || rest.starts_with('#')
    })
}

/// Reads a stream into documents, each with its text. An empty document (even a tagged one, which reads as
/// null) is no object and is dropped, as an explicit `null` document is: that keeps the output a fixed point.
pub fn read_stream(input: &str) -> Result<Vec<Document<'_>>, OfflineError> {
    let Some(pieces) = cut(input) else {
        return read_whole(input);
    };
    let mut docs = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match read_piece(piece.text) {
            Ok(None) => {}
            Ok(Some(doc)) => docs.push(doc),
            Err(e) => {
                // The cut is only a shortcut: where the stream read whole holds, its reading stands.
                if let Ok(whole) = read_whole(input) {
                    return Ok(whole);
                }
                // Lines counted in the whole stream.
                let message = e.render_with_options(serde_saphyr::render_options! {
                    line_offset: piece.line as u64,
                });
                return Err(OfflineError::Yaml(format!(
                    "document {}: {message}",
                    docs.len() + 1
                )));
            }
        }
    }
    Ok(docs)
}

/// One piece of a cut stream as a document with its text; `None` for an empty or null one.
pub(super) fn read_piece(text: &str) -> Result<Option<Document<'_>>, serde_saphyr::Error> {
    if is_empty_piece(text) {
        return Ok(None);
    }
    Ok(
        match serde_saphyr::from_str_with_options::<Value>(text, yaml_options(text))? {
            Value::Null => None,
            value => Some(Document {
                value,
                source: Some(text),
            }),
        },
    )
}

/// Reads the stream as one: for what [`cut`] does not cover, and to check what a piece could not parse.
fn read_whole(input: &str) -> Result<Vec<Document<'_>>, OfflineError> {
    let values = serde_saphyr::from_multiple_with_options::<Value>(input, yaml_options(input))
        .map_err(|e| OfflineError::Yaml(e.to_string()))?;
    Ok(values
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|value| Document {
            value,
            source: None,
        })
        .collect())
}

/// Parses a stream into its documents' values.
pub fn parse_stream(input: &str) -> Result<Vec<Value>, OfflineError> {
    Ok(read_stream(input)?.into_iter().map(|d| d.value).collect())
}

/// Writes documents back as a YAML stream, each printed from its value.
pub fn write_stream(docs: &[Value]) -> String {
    let mut out = String::with_capacity(docs.len() * 1024);
    for doc in docs {
        write_value(&mut out, doc);
    }
    out
}

fn write_value(out: &mut String, doc: &Value) {
    out.push_str("---\n");
    // A JSON value always serializes to YAML.
    out.push_str(&serde_saphyr::to_string(doc).expect("JSON values serialize to YAML"));
    if !out.ends_with('\n') {
        out.push('\n');
    }
}

/// Writes documents back: a document the injector left alone (`changed` false) as its own text when it has
/// one, the others printed from their value.
pub(super) fn write_documents(docs: &[Document<'_>], changed: &[bool]) -> String {
    let size: usize = docs.iter().map(|d| d.source.map_or(1024, str::len)).sum();
    let mut out = String::with_capacity(size + size / 4);
    for (doc, changed) in docs.iter().zip(changed) {
        write_document(&mut out, doc, *changed);
    }
    out
}

pub(super) fn write_document(out: &mut String, doc: &Document<'_>, changed: bool) {
    match doc.source {
        Some(text) if !changed => {
            if !is_marker(text, "---") {
                out.push_str("---\n");
            }
            out.push_str(text);
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
        _ => write_value(out, &doc.value),
    }
}
