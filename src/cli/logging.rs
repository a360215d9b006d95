//! `--log-format text`: tracing-subscriber's stock line, kept to one line. `--log-format json`: the stock
//! `json().flatten_event(true).with_current_span(true)` object, written here without re-parsing each span's fields
//! at every event: the stock one misses the CPU bound (BENCHMARKS.md, row "log line formatter: stock vs project").

use std::fmt::{self, Write as _};
use std::io;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use super::LogFormat;

/// Installs the global subscriber: `RUST_LOG` filters (default `info`), lines go to stderr.
pub(crate) fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder
            .with_writer(OneLine(io::stderr))
            .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
            .init(),
        LogFormat::Json => builder
            .with_writer(io::stderr)
            .with_ansi(false)
            .fmt_fields(JsonFields)
            .event_format(JsonLine(SystemTime))
            .init(),
    }
}

/// Writes each line with its control characters escaped as `Debug` does (`\n`, `\x1b`, `\u{85}`): the stock text
/// format writes a `%` value or an error's text raw, and a request's words reach those (a namespace in a denial), so
/// a Pod could forge a line or drive the terminal of whoever reads `kubectl logs`. One event is one `write_all`.
#[derive(Clone, Copy)]
pub(crate) struct OneLine<M>(pub(crate) M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for OneLine<M> {
    type Writer = OneLine<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLine(self.0.make_writer())
    }
}

impl<W: io::Write> io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        // Bytes of no control character: printable, tab, and UTF-8 other than the C1 range's lead byte 0xc2.
        let risky = |b: &u8| (*b < 0x20 && *b != b'\t') || *b == 0x7f || *b == 0xc2;
        if !body.iter().any(risky) {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        }
        let Ok(text) = std::str::from_utf8(body) else {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        };
        // One write for the whole line, so that lines of other threads never land inside it.
        let mut line = String::with_capacity(buf.len() + 16);
        for c in text.chars() {
            match c {
                '\t' => line.push(c),
                '\n' => line.push_str("\\n"),
                '\r' => line.push_str("\\r"),
                c if c.is_control() && (c as u32) < 0x80 => {
                    let _ = write!(line, "\\x{:02x}", c as u32);
                }
                c if c.is_control() => {
                    let _ = write!(line, "\\u{{{:x}}}", c as u32);
                }
                c => line.push(c),
            }
        }
        line.push_str(if body.len() < buf.len() { "\n" } else { "" });
        self.0.write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Room for the admission span's fields (uid, namespace, Pod, operation, decision, reason).
const SPAN_FIELDS_BYTES: usize = 256;

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

/// The JSON format's line: `timestamp`, `level`, the event's fields (`message` first), `target`, then `span` (the
/// innermost span's fields and its `name`) and `spans` (the scope from the root) when there is a span.
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

    /// Runs `log_everything` under a subscriber built like `init`'s (`ours`) or the plain stock one, into lines.
    fn capture(json: bool, ours: bool) -> String {
        let lines = Lines::default();
        let builder = tracing_subscriber::fmt().with_ansi(false).with_timer(Fixed);
        match (json, ours) {
            (false, true) => {
                let s = builder.with_writer(OneLine(lines.clone())).finish();
                tracing::subscriber::with_default(s, log_everything);
            }
            (false, false) => {
                let s = builder.with_writer(lines.clone()).finish();
                tracing::subscriber::with_default(s, log_everything);
            }
            (true, true) => {
                let s = builder
                    .with_writer(lines.clone())
                    .fmt_fields(JsonFields)
                    .event_format(JsonLine(Fixed))
                    .finish();
                tracing::subscriber::with_default(s, log_everything);
            }
            (true, false) => {
                let s = builder
                    .with_writer(lines.clone())
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
    fn text_lines_are_the_stock_formatter_s_kept_to_one_line() {
        let ours = capture(false, true);
        let stock = capture(false, false);
        // The stock line writes the error's newline and a `%` value's control characters as they are; ours
        // escapes them.
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
        assert!(ours.contains("listening \\x1b[2J"), "{ours}");
        assert_eq!(ours.matches(" INFO ").count(), 2, "{ours}");
        assert!(
            ours.contains("  WARN rustls::conn: sending fatal alert\n"),
            "{ours}"
        );
        assert!(ours.contains(
            "admission{uid=\"705ab4f5-6393-11e8-b7cc-42010a800002\" namespace=\"pay\\\"ments\\\\\\n\\u{1b}[31m é\" pod=\"\"}"
        ), "{ours}");
        assert!(
            ours.contains("dry_run=false patch_ops=10 delta=-4"),
            "{ours}"
        );
    }

    #[test]
    fn one_line_escapes_the_control_characters_inside_a_line() {
        let lines = Lines::default();
        let mut w = OneLine(lines.clone());
        for line in [
            "plain\tline é\n",
            "a\nb\rc\u{1b}[2J\u{85}\u{9b}\x7f\n",
            "no end\n\n",
            "none",
        ] {
            io::Write::write_all(&mut w, line.as_bytes()).unwrap();
        }
        assert_eq!(
            lines.text(),
            "plain\tline é\na\\nb\\rc\\x1b[2J\\u{85}\\u{9b}\\x7f\nno end\\n\nnone"
        );
    }

    /// The JSON lines parse, and say what tracing-subscriber's JSON says: the same members with the same values
    /// (the order of members aside).
    #[test]
    fn json_lines_carry_the_stock_formatter_s_members() {
        let ours = capture(true, true);
        let stock = capture(true, false);
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
