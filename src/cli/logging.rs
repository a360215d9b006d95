//! The log lines of `--log-format text|json`: tracing-subscriber's layouts, written without its generic field
//! visitors where the value is plain, and (JSON) without its round trip through `serde_json::Value`.
//!
//! Every admission review logs one line in the `admission` span (README, docs/operations.md). With the stock
//! formatters that line cost about 7 us of CPU a request in text and 20 us in JSON, the format the manifests
//! install (BENCHMARKS.md, "The log line"): the text visitor quotes each string through `Debug` one character at a
//! time, and the JSON formatter stores a span's fields as JSON text, parses that text back into a map at every
//! event, twice (`span` and `spans`), and re-encodes it.
//!
//! - **Text** keeps tracing-subscriber's `Full` line (timestamp, level, spans, target, fields) and its field
//!   visitor for anything but a plain value: a string of printable ASCII without `"` or `\` (what `Debug`
//!   writes unchanged), a bool or an integer are written here, the same bytes. Unlike the stock visitor, it escapes a
//!   value's control characters (a newline in a `%` value or an error's text), so that one event is one line
//!   whatever a request says. On a terminal (ANSI colours) the stock formatter does everything, as it did.
//! - **JSON** writes the same object as tracing-subscriber's `json().flatten_event(true).with_current_span(true)`:
//!   `timestamp`, `level`, the event's fields flattened (`message` first), `target`, then `span` (the innermost
//!   span's fields and its `name`) and `spans` (every span of the scope from the root), when there is a span. A
//!   span's fields are kept as a JSON fragment and copied, never parsed. A field recorded twice on a span would
//!   appear twice (jq keeps the last); the webhook records each field of its span once.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use super::LogFormat;

/// Installs the global subscriber: `RUST_LOG` filters (default `info`), lines go to stderr.
pub(crate) fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        // On a terminal, the stock line with its colours: the fast one is for logs that a machine collects.
        LogFormat::Text if std::io::IsTerminal::is_terminal(&std::io::stderr()) => {
            builder.with_ansi(true).init()
        }
        LogFormat::Text => builder
            .with_ansi(false)
            .fmt_fields(TextFields)
            .event_format(TextLine(SystemTime))
            .init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields)
            .event_format(JsonLine(SystemTime))
            .init(),
    }
}

/// The text format's field formatter: tracing-subscriber's `DefaultFields`, byte for byte, except that a value's
/// control characters are escaped ([`OneLine`]).
pub(crate) struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        // Never with colours: `init` pairs these fields with `TextLine` only, and a terminal gets the stock
        // formatter whole.
        let mut line = OneLine(&mut writer);
        let mut visitor = TextVisitor {
            writer: Writer::new(&mut line),
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        if current.fields.is_empty() {
            // The admission span's six fields at once: one allocation, not one per doubling.
            current.fields.reserve(SPAN_FIELDS_BYTES);
        } else {
            current.fields.push(' ');
        }
        self.format_fields(current.as_writer(), fields)
    }
}

/// Room for the admission span's fields (uid, namespace, Pod, operation, decision, reason) in either format.
const SPAN_FIELDS_BYTES: usize = 256;

struct TextVisitor<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

impl TextVisitor<'_> {
    /// Whether `field` is written by this visitor as `name=value`: the stock visitor treats `message`,
    /// `r#`-prefixed names and `log.` metadata specially.
    fn plain(&self, field: &Field) -> bool {
        let name = field.name();
        self.result.is_ok()
            && name != "message"
            && !name.starts_with("r#")
            && !name.starts_with("log.")
    }

    fn pad(&mut self) {
        if self.is_empty {
            self.is_empty = false;
        } else {
            self.result = self.writer.write_char(' ');
        }
    }

    /// The stock visitor, for one field, continuing this visitor's line.
    fn stock(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() {
            return;
        }
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut visitor);
        self.result = tracing_subscriber::field::VisitOutput::finish(visitor);
        // It pads and writes unless the field is `log.` metadata, which it skips.
        self.is_empty = false;
    }

    fn number(&mut self, field: &Field, value: impl fmt::Display) {
        self.pad();
        if self.result.is_ok() {
            self.result = write!(self.writer, "{}={value}", field.name());
        }
    }
}

/// Keeps a field on its line: a value written with `%` (its `Display`), or an error's text, may hold a newline or
/// a terminal escape, and the stock text visitor writes those as they are. The request's own words reach such
/// values (a namespace name in a denial), so any Pod that can reach the webhook could write a line that looks like
/// the webhook's, or drive the terminal of whoever reads `kubectl logs`. Written here as `Debug` writes them in a
/// string: `\n`, `\r`, `\x1b`, `\u{85}`. Strings and messages are already escaped, so they pass unchanged.
struct OneLine<'a, 'w>(&'a mut Writer<'w>);

impl fmt::Write for OneLine<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let risky = |c: char| c.is_control() && c != '\t';
        if !s.bytes().any(|b| b < 0x20 || b == 0x7f || b == 0xc2) {
            return self.0.write_str(s);
        }
        let mut start = 0;
        for (i, c) in s.char_indices() {
            if !risky(c) {
                continue;
            }
            self.0.write_str(&s[start..i])?;
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                c if (c as u32) < 0x80 => write!(self.0, "\\x{:02x}", c as u32)?,
                c => write!(self.0, "\\u{{{:x}}}", c as u32)?,
            }
            start = i + c.len_utf8();
        }
        self.0.write_str(&s[start..])
    }
}

/// A string `Debug` writes as itself between quotes: printable ASCII, no quote, no backslash.
fn debug_is_plain(value: &str) -> bool {
    value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.plain(field) && debug_is_plain(value) {
            self.pad();
            if self.result.is_ok() {
                let w = &mut self.writer;
                self.result = (|| {
                    w.write_str(field.name())?;
                    w.write_str("=\"")?;
                    w.write_str(value)?;
                    w.write_char('"')
                })();
            }
        } else {
            self.stock(|v| v.record_str(field, value));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.plain(field) {
            self.number(field, value);
        } else {
            self.stock(|v| v.record_bool(field, value));
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.plain(field) {
            self.number(field, value);
        } else {
            self.stock(|v| v.record_u64(field, value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.plain(field) {
            self.number(field, value);
        } else {
            self.stock(|v| v.record_i64(field, value));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.stock(|v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.stock(|v| v.record_debug(field, value));
    }
}

/// The JSON format's field formatter: a span's fields as the members of a JSON object, without the braces
/// (`"uid":"…","namespace":"…"`), appended to as fields are recorded.
pub(crate) struct JsonFields;

impl<'writer> FormatFields<'writer> for JsonFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = JsonVisitor {
            out: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        if current.fields.is_empty() {
            current.fields.reserve(SPAN_FIELDS_BYTES);
        }
        let mut visitor = JsonVisitor {
            first: current.fields.is_empty(),
            out: &mut current.fields,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

/// Writes fields as JSON object members, each after a comma unless it is the first.
struct JsonVisitor<'a> {
    out: &'a mut dyn fmt::Write,
    first: bool,
    result: fmt::Result,
}

impl JsonVisitor<'_> {
    /// Writes `"name":` (with the comma before it); false once writing failed. A `log` record's `log.` fields
    /// are kept, as tracing-subscriber's JSON keeps them.
    fn key(&mut self, field: &Field) -> bool {
        let name = field.name();
        if self.result.is_err() {
            return false;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let comma = if self.first { "" } else { "," };
        self.first = false;
        self.result = (|| {
            self.out.write_str(comma)?;
            self.out.write_char('"')?;
            JsonEscape(&mut *self.out).write_str(name)?;
            self.out.write_str("\":")
        })();
        self.result.is_ok()
    }

    /// Writes `"name":"value"`, `value` escaped as it is written.
    fn string(&mut self, field: &Field, value: impl FnOnce(&mut JsonEscape<'_>) -> fmt::Result) {
        if self.key(field) {
            self.result = (|| {
                self.out.write_char('"')?;
                value(&mut JsonEscape(&mut *self.out))?;
                self.out.write_char('"')
            })();
        }
    }

    fn raw(&mut self, field: &Field, value: impl fmt::Display) {
        if self.key(field) {
            self.result = write!(self.out, "{value}");
        }
    }
}

impl Visit for JsonVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.string(field, |out| out.write_str(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field, value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN nor infinity: serde_json writes them as null, as tracing-subscriber's JSON does.
        match serde_json::to_string(&value) {
            Ok(text) => self.raw(field, text),
            Err(_) => self.raw(field, "null"),
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.string(field, |out| write!(out, "{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.string(field, |out| write!(out, "{value:?}"));
    }
}

/// Escapes what is written to it as the content of a JSON string, as serde_json does.
struct JsonEscape<'a>(&'a mut dyn fmt::Write);

impl fmt::Write for JsonEscape<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let bytes = s.as_bytes();
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..=0x1f => "",
                _ => continue,
            };
            // Only ASCII bytes are cut at, so both slices are on character boundaries.
            self.0.write_str(&s[start..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

/// The text format's line without colours: tracing-subscriber's `Full` format (timestamp, level, each span of the
/// scope with its fields, target, the event's fields), the same bytes but for [`OneLine`]'s escapes.
pub(crate) struct TextLine<T = SystemTime>(pub(crate) T);

impl<S, T: FormatTime> FormatEvent<S, TextFields> for TextLine<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, TextFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        if self.0.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        writer.write_str(match *meta.level() {
            Level::TRACE => " TRACE ",
            Level::DEBUG => " DEBUG ",
            Level::INFO => "  INFO ",
            Level::WARN => "  WARN ",
            Level::ERROR => " ERROR ",
        })?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                writer.write_str(span.metadata().name())?;
                if let Some(fields) = span.extensions().get::<FormattedFields<TextFields>>()
                    && !fields.fields.is_empty()
                {
                    writer.write_char('{')?;
                    writer.write_str(&fields.fields)?;
                    writer.write_char('}')?;
                }
                writer.write_char(':')?;
            }
            writer.write_char(' ')?;
        }
        writer.write_str(meta.target())?;
        writer.write_str(": ")?;
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// The JSON format's line (see the module's documentation).
pub(crate) struct JsonLine<T = SystemTime>(pub(crate) T);

impl<S, T: FormatTime> FormatEvent<S, JsonFields> for JsonLine<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        writer.write_str("{\"timestamp\":\"")?;
        self.0.format_time(&mut writer)?;
        write!(writer, "\",\"level\":\"{}\"", meta.level())?;
        let mut visitor = JsonVisitor {
            out: &mut writer,
            first: false,
            result: Ok(()),
        };
        event.record(&mut visitor);
        visitor.result?;
        writer.write_str(",\"target\":\"")?;
        JsonEscape(&mut writer).write_str(meta.target())?;
        writer.write_char('"')?;
        if let Some(leaf) = ctx.event_scope().and_then(|mut scope| scope.next()) {
            writer.write_str(",\"span\":")?;
            write_span(&mut writer, &leaf)?;
            writer.write_str(",\"spans\":[")?;
            for (i, span) in ctx
                .event_scope()
                .into_iter()
                .flat_map(|s| s.from_root())
                .enumerate()
            {
                if i > 0 {
                    writer.write_char(',')?;
                }
                write_span(&mut writer, &span)?;
            }
            writer.write_char(']')?;
        }
        writer.write_str("}\n")
    }
}

/// One span as a JSON object: its fields, then its `name`.
fn write_span<S>(writer: &mut Writer<'_>, span: &SpanRef<'_, S>) -> fmt::Result
where
    S: for<'a> LookupSpan<'a>,
{
    writer.write_char('{')?;
    if let Some(fields) = span.extensions().get::<FormattedFields<JsonFields>>()
        && !fields.fields.is_empty()
    {
        writer.write_str(&fields.fields)?;
        writer.write_char(',')?;
    }
    writer.write_str("\"name\":\"")?;
    JsonEscape(writer).write_str(span.metadata().name())?;
    writer.write_str("\"}")
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing::{info, info_span, warn};
    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[derive(Debug)]
    struct Failure;
    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("disk \"full\"\n(again)")
        }
    }
    impl std::error::Error for Failure {}

    /// The lines the webhook writes, and the values the fast paths must leave to the stock visitor.
    fn log_everything() {
        let span = info_span!(
            "admission",
            uid = tracing::field::Empty,
            namespace = tracing::field::Empty,
            pod = tracing::field::Empty,
        );
        let _entered = span.enter();
        warn!(n = 3_u64, "before the fields are recorded");
        span.record("uid", "705ab4f5-6393-11e8-b7cc-42010a800002");
        span.record("namespace", "pay\"ments\\\n\u{1b}[31m é");
        span.record("pod", "");
        info!(
            dry_run = false,
            patch_ops = 10_u64,
            delta = -4_i64,
            ratio = 0.5_f64,
            nan = f64::NAN,
            name = "web-0",
            quoted = "a \"b\"",
            r#type = "x",
            debug = ?Some(std::time::Duration::from_millis(1500)),
            shown = %"tab\there",
            error = &Failure as &(dyn std::error::Error + 'static),
            "admission review answered"
        );
        drop(_entered);
        info!(
            addr = "127.0.0.1:8443",
            hostile = %"ns\nforged\u{1b}[2J\r\n\u{85}",
            "listening \u{1b}[2J"
        );
        // A `log` record (rustls logs through `log`): the line shows its own target and level.
        tracing_log::format_trace(
            &log::Record::builder()
                .target("rustls::conn")
                .level(log::Level::Warn)
                .args(format_args!("sending fatal alert"))
                .build(),
        )
        .unwrap();
    }

    /// One time for every line, so that lines compare.
    struct Fixed;
    impl FormatTime for Fixed {
        fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
            w.write_str("2026-12-04T19:13:36.530895Z")
        }
    }

    /// Runs `log_everything` under a subscriber built like `init`'s, with `fields` and `event`, into lines.
    fn capture(json: bool, stock: bool) -> String {
        let lines = Lines::default();
        let builder = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .with_ansi(false)
            .with_timer(Fixed);
        match (json, stock) {
            (false, false) => {
                let s = builder
                    .fmt_fields(TextFields)
                    .event_format(TextLine(Fixed))
                    .finish();
                tracing::subscriber::with_default(s, log_everything);
            }
            (false, true) => {
                let s = builder.finish();
                tracing::subscriber::with_default(s, log_everything);
            }
            (true, false) => {
                let s = builder
                    .fmt_fields(JsonFields)
                    .event_format(JsonLine(Fixed))
                    .finish();
                tracing::subscriber::with_default(s, log_everything);
            }
            (true, true) => {
                let s = builder
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .finish();
                tracing::subscriber::with_default(s, log_everything);
            }
        }
        lines.text()
    }

    #[test]
    fn text_lines_are_the_stock_formatter_s_with_control_characters_escaped() {
        let ours = capture(false, false);
        let stock = capture(false, true);
        // The stock visitor writes the error's newline and a `%` value's escape as they are; ours escapes them.
        let stock = stock
            .replace("\"full\"\n(again)", "\"full\"\\n(again)")
            .replace(
                "hostile=ns\nforged\u{1b}[2J\r\n\u{85}",
                "hostile=ns\\nforged\\x1b[2J\\r\\n\\u{85}",
            );
        assert_eq!(ours, stock);
        assert_eq!(ours.lines().count(), 4, "one line per event:\n{ours}");
        assert!(
            ours.contains("hostile=ns\\nforged\\x1b[2J\\r\\n\\u{85}"),
            "{ours}"
        );
        assert_eq!(ours.matches(" INFO ").count(), 2, "{ours}");
        assert!(
            ours.contains("  WARN rustls::conn: sending fatal alert\n"),
            "{ours}"
        );
        // The fast path was taken (a plain string, a bool, numbers) and escapes were left to the stock visitor.
        assert!(ours.contains(
            "admission{uid=\"705ab4f5-6393-11e8-b7cc-42010a800002\" namespace=\"pay\\\"ments\\\\\\n\\u{1b}[31m é\" pod=\"\"}"
        ), "{ours}");
        assert!(
            ours.contains("dry_run=false patch_ops=10 delta=-4"),
            "{ours}"
        );
    }

    /// The JSON lines parse, and say what tracing-subscriber's JSON says: the same members with the same values
    /// (the order of members aside).
    #[test]
    fn json_lines_carry_the_stock_formatter_s_members() {
        let ours = capture(true, false);
        let stock = capture(true, true);
        let parse = |text: &str| -> Vec<serde_json::Value> {
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect()
        };
        let (ours_v, stock_v) = (parse(&ours), parse(&stock));
        for (o, s) in ours_v.iter().zip(&stock_v) {
            // Maps compare as maps: the members' order is not compared.
            assert_eq!(o, s, "ours:\n{ours}\nstock:\n{stock}");
        }
        let answered = &ours_v[1];
        assert_eq!(answered["message"], "admission review answered");
        assert_eq!(answered["span"]["namespace"], "pay\"ments\\\n\u{1b}[31m é");
        assert_eq!(answered["span"]["name"], "admission");
        assert_eq!(
            answered["spans"][0]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        assert_eq!(answered["patch_ops"], 10);
        assert_eq!(answered["nan"], serde_json::Value::Null);
        assert_eq!(answered["error"], "disk \"full\"\n(again)");
        // The line before the span's fields were recorded carries the span's name only.
        assert_eq!(ours_v[0]["span"], serde_json::json!({"name": "admission"}));
        assert_eq!(ours_v[3]["target"], "rustls::conn");
        assert_eq!(ours_v[3]["level"], "WARN");
        // Outside any span: no span members.
        assert!(ours_v[2].get("span").is_none() && ours_v[2].get("spans").is_none());
    }

    #[test]
    fn json_escapes_as_serde_json_does() {
        let all: String = (0u8..0x80).map(char::from).chain("é€😀".chars()).collect();
        let mut ours = String::from("\"");
        JsonEscape(&mut ours).write_str(&all).unwrap();
        ours.push('"');
        assert_eq!(ours, serde_json::to_string(&all).unwrap());
    }
}
