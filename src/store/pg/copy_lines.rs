//! A closed period's frozen session lines read with `COPY (…) TO STDOUT (FORMAT binary)`
//! instead of a SELECT: PostgreSQL writes the rows as its own COPY does (the export's
//! baseline, reports/usage.md), and each row reaches the service as one message of bytes
//! rather than a decoded row with its column table.
//!
//! Decoded by hand: the format is a fixed header, then tuples of length-prefixed fields
//! (PostgreSQL's docs, "Binary Format" under COPY), and no crate decodes it from sqlx's
//! byte stream (tokio-postgres's binary copy reads its own client's).

use rush_meter_core::export::SessionLine;

/// The first 11 bytes of every binary COPY.
const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";
/// The columns of a session line, in `SessionLine`'s order.
const COLUMNS: i16 = 12;
/// Past this many consumed bytes the buffer is compacted (a tuple is ~100 bytes).
const COMPACT_PAST: usize = 64 * 1024;

/// What is wrong with the stream, for the error that ends the export.
pub type DecodeError = String;

/// Bytes of a binary COPY of session lines as they arrive, decoded a tuple at a time.
#[derive(Default)]
pub struct LineDecoder {
    buf: Vec<u8>,
    /// Bytes of `buf` already decoded.
    at: usize,
    header_read: bool,
    trailer_read: bool,
}

/// A read position in bytes that may end too soon: `None` means "wait for more".
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(out)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    /// A field: its bytes, or `Some(None)` for NULL.
    fn field(&mut self) -> Option<Option<&'a [u8]>> {
        match self.i32()? {
            -1 => Some(None),
            n => self.take(usize::try_from(n).ok()?).map(Some),
        }
    }
}

fn text(field: Option<&[u8]>, column: &str) -> Result<Option<String>, DecodeError> {
    field
        .map(|b| String::from_utf8(b.to_vec()).map_err(|_| format!("`{column}` is not UTF-8")))
        .transpose()
}

fn required_text(field: Option<&[u8]>, column: &str) -> Result<String, DecodeError> {
    text(field, column)?.ok_or_else(|| format!("`{column}` is NULL"))
}

fn bigint(field: Option<&[u8]>, column: &str) -> Result<Option<i64>, DecodeError> {
    field
        .map(|b| {
            <[u8; 8]>::try_from(b)
                .map(i64::from_be_bytes)
                .map_err(|_| format!("`{column}` is {} bytes, not a BIGINT's 8", b.len()))
        })
        .transpose()
}

fn required_bigint(field: Option<&[u8]>, column: &str) -> Result<i64, DecodeError> {
    bigint(field, column)?.ok_or_else(|| format!("`{column}` is NULL"))
}

impl LineDecoder {
    /// Add the next bytes of the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        } else if self.at > COMPACT_PAST {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole line, or `None` when the bytes so far hold none (more are needed,
    /// or the trailer was read).
    pub fn next_line(&mut self) -> Result<Option<SessionLine>, DecodeError> {
        if !self.header_read && !self.read_header()? {
            return Ok(None);
        }
        if self.trailer_read {
            return match self.at == self.buf.len() {
                true => Ok(None),
                false => Err("bytes after the trailer".into()),
            };
        }
        let mut c = Cursor {
            bytes: &self.buf[self.at..],
            pos: 0,
        };
        let Some(count) = c.i16() else {
            return Ok(None);
        };
        if count == -1 {
            self.at += c.pos;
            self.trailer_read = true;
            return self.next_line();
        }
        if count != COLUMNS {
            return Err(format!("a tuple of {count} columns, not {COLUMNS}"));
        }
        let mut f = [None; COLUMNS as usize];
        for slot in &mut f {
            let Some(field) = c.field() else {
                return Ok(None);
            };
            *slot = field;
        }
        let line = SessionLine {
            org_id: required_text(f[0], "org_id")?,
            session_id: required_text(f[1], "session_id")?,
            project_id: text(f[2], "project_id")?,
            started_by: text(f[3], "started_by")?,
            agent: text(f[4], "agent")?,
            running_seconds: required_bigint(f[5], "running_seconds")?,
            parked_seconds: required_bigint(f[6], "parked_seconds")?,
            spans: required_bigint(f[7], "spans")?,
            first_start: bigint(f[8], "first_start")?,
            last_end: bigint(f[9], "last_end")?,
            end_status: text(f[10], "end_status")?,
            adjustment_seconds: required_bigint(f[11], "adjustment_seconds")?,
        };
        self.at += c.pos;
        Ok(Some(line))
    }

    /// Read the header if it is all there; false if more bytes are needed.
    fn read_header(&mut self) -> Result<bool, DecodeError> {
        let mut c = Cursor {
            bytes: &self.buf[self.at..],
            pos: 0,
        };
        let (Some(signature), Some(_flags), Some(extension)) = (c.take(11), c.i32(), c.i32())
        else {
            return Ok(false);
        };
        if signature != SIGNATURE {
            return Err("not a binary COPY (its signature differs)".into());
        }
        let extension = usize::try_from(extension).map_err(|_| "a negative header extension")?;
        if c.take(extension).is_none() {
            return Ok(false);
        }
        self.at += c.pos;
        self.header_read = true;
        Ok(true)
    }

    /// Check that the stream ended where a binary COPY ends: after its trailer.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match (self.trailer_read, self.at == self.buf.len()) {
            (true, true) => Ok(()),
            (false, _) => Err("the stream ended before the trailer".into()),
            (true, false) => Err("bytes after the trailer".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary COPY of `lines` as PostgreSQL writes it.
    fn encode(lines: &[SessionLine]) -> Vec<u8> {
        let mut out = SIGNATURE.to_vec();
        out.extend(0i32.to_be_bytes());
        out.extend(0i32.to_be_bytes());
        let text = |out: &mut Vec<u8>, v: &Option<String>| match v {
            None => out.extend((-1i32).to_be_bytes()),
            Some(s) => {
                out.extend((s.len() as i32).to_be_bytes());
                out.extend(s.as_bytes());
            }
        };
        let int = |out: &mut Vec<u8>, v: Option<i64>| match v {
            None => out.extend((-1i32).to_be_bytes()),
            Some(n) => {
                out.extend(8i32.to_be_bytes());
                out.extend(n.to_be_bytes());
            }
        };
        for l in lines {
            out.extend(COLUMNS.to_be_bytes());
            text(&mut out, &Some(l.org_id.clone()));
            text(&mut out, &Some(l.session_id.clone()));
            text(&mut out, &l.project_id);
            text(&mut out, &l.started_by);
            text(&mut out, &l.agent);
            int(&mut out, Some(l.running_seconds));
            int(&mut out, Some(l.parked_seconds));
            int(&mut out, Some(l.spans));
            int(&mut out, l.first_start);
            int(&mut out, l.last_end);
            text(&mut out, &l.end_status);
            int(&mut out, Some(l.adjustment_seconds));
        }
        out.extend((-1i16).to_be_bytes());
        out
    }

    fn line(n: i64) -> SessionLine {
        SessionLine {
            org_id: format!("org-{n}"),
            session_id: format!("s\t{n}\n\\é"),
            project_id: (n % 2 == 0).then(|| format!("p{n}")),
            started_by: (n % 3 == 0).then(String::new),
            agent: Some("codex".into()),
            running_seconds: n * 7,
            parked_seconds: -n,
            spans: n,
            first_start: (n % 2 == 1).then_some(i64::MAX - n),
            last_end: Some(i64::MIN + n),
            end_status: None,
            adjustment_seconds: n - 5,
        }
    }

    /// Decode `bytes` fed in pieces of `step` bytes.
    fn decode(bytes: &[u8], step: usize) -> Result<Vec<SessionLine>, DecodeError> {
        let mut d = LineDecoder::default();
        let mut out = Vec::new();
        for chunk in bytes.chunks(step) {
            d.push(chunk);
            while let Some(l) = d.next_line()? {
                out.push(l);
            }
        }
        d.finish()?;
        Ok(out)
    }

    #[test]
    fn lines_decode_whole_whatever_the_pieces_the_stream_arrives_in() {
        let lines: Vec<SessionLine> = (0..700).map(line).collect();
        let bytes = encode(&lines);
        for step in [1, 2, 3, 7, 19, 100, 4096, bytes.len()] {
            assert_eq!(decode(&bytes, step).unwrap(), lines, "pieces of {step}");
        }
        assert_eq!(decode(&encode(&[]), 5).unwrap(), vec![]);
    }

    #[test]
    fn a_cut_or_foreign_stream_is_an_error_not_fewer_lines() {
        let bytes = encode(&[line(1), line(2)]);
        let cut = decode(&bytes[..bytes.len() - 1], 16).unwrap_err();
        assert!(cut.contains("before the trailer"), "{cut}");
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode(&extra, 16)
            .unwrap_err()
            .contains("after the trailer"));
        let mut foreign = bytes.clone();
        foreign[0] = b'X';
        assert!(decode(&foreign, 16).unwrap_err().contains("signature"));
        let mut narrow = bytes;
        // The first tuple's column count, just past the 19-byte header.
        narrow[19..21].copy_from_slice(&11i16.to_be_bytes());
        assert!(decode(&narrow, 16).unwrap_err().contains("11 columns"));
    }
}
