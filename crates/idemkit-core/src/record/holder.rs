//! Who holds a reservation: [`Holder`], recorded with it (record format version 2).

use std::sync::Arc;

use super::RecordError;

/// The process that reserved a key: its host, process id and a name the application may set
/// (by default the executable's name), recorded in the reservation so an operator can tell
/// whose it is and whether that process still renews it.
///
/// Each text is at most [`Holder::MAX_TEXT`] bytes (longer ones are cut at a character
/// boundary) and has no control characters (replaced by `?`): it is shown on a terminal.
///
/// # Example
///
/// ```
/// use idemkit_core::record::Holder;
///
/// let me = Holder::this_process().named("billing-worker");
/// assert_eq!(me.pid, std::process::id());
/// assert_eq!(me.name, "billing-worker");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Holder {
    /// The host name.
    pub host: String,
    /// The process id on that host.
    pub pid: u32,
    /// The application's name for the process.
    pub name: String,
}

impl Holder {
    /// The longest host or name kept, in bytes.
    pub const MAX_TEXT: usize = 64;

    /// A holder from its parts (cleaned: see [`Holder`]).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::record::Holder;
    /// let h = Holder::new("web-1", 42, "api\n");
    /// assert_eq!((h.host.as_str(), h.pid, h.name.as_str()), ("web-1", 42, "api?"));
    /// ```
    pub fn new(host: &str, pid: u32, name: &str) -> Self {
        Holder {
            host: clean(host),
            pid,
            name: clean(name),
        }
    }

    /// This process: the host's name (`/proc/sys/kernel/hostname`, else `HOSTNAME` or
    /// `COMPUTERNAME`, else `unknown`), its process id, and the executable's file name.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::record::Holder;
    /// assert!(!Holder::this_process().host.is_empty());
    /// ```
    pub fn this_process() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .unwrap_or_else(|| "unknown".into());
        let name = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default();
        Holder::new(&host, std::process::id(), &name)
    }

    /// The same process under another name.
    ///
    /// # Example
    ///
    /// See [`Holder`].
    pub fn named(mut self, name: &str) -> Self {
        self.name = clean(name);
        self
    }

    /// The record format's holder block without its lease: `pid:u32 host_len:u8 host
    /// name_len:u8 name` (see `Record::encode`).
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pid.to_be_bytes());
        for text in [&self.host, &self.name] {
            // `clean` keeps each under 256 bytes.
            out.push(text.len() as u8);
            out.extend_from_slice(text.as_bytes());
        }
    }

    /// The holder block a store writes for a reservation of `lease_ms` (version 2's bytes
    /// after the fingerprint): `lease_ms:u64 pid:u32 host_len:u8 host name_len:u8 name`.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::record::Holder;
    /// let block = Holder::new("h", 7, "n").block(1500);
    /// assert_eq!(block, [&1500u64.to_be_bytes()[..], &7u32.to_be_bytes(), &[1, b'h', 1, b'n']].concat());
    /// ```
    pub fn block(&self, lease_ms: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 4 + 2 + self.host.len() + self.name.len());
        out.extend_from_slice(&lease_ms.to_be_bytes());
        self.encode_into(&mut out);
        out
    }

    /// Reads a holder block written by [`block`](Holder::block) (a store that keeps it in a
    /// column of its own): the holder and its lease, and the bytes after the block.
    ///
    /// # Errors
    ///
    /// [`RecordError`] if the bytes are not one block.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::record::Holder;
    /// let h = Holder::new("h", 7, "n");
    /// let block = h.block(1500);
    /// let (back, lease, rest) = Holder::from_block(&block)?;
    /// assert_eq!((back, lease, rest.len()), (h, 1500, 0));
    /// # Ok::<(), idemkit_core::RecordError>(())
    /// ```
    pub fn from_block(b: &[u8]) -> Result<(Holder, u64, &[u8]), RecordError> {
        let (lease, r) = b.split_at_checked(8).ok_or(RecordError::LengthMismatch)?;
        let (pid, r) = r.split_at_checked(4).ok_or(RecordError::LengthMismatch)?;
        let (host, r) = text(r)?;
        let (name, r) = text(r)?;
        let pid = u32::from_be_bytes(pid.try_into().expect("4 bytes"));
        let lease = u64::from_be_bytes(lease.try_into().expect("8 bytes"));
        // `text` admits only what `clean` writes: nothing to clean again.
        let holder = Holder {
            host: host.to_owned(),
            pid,
            name: name.to_owned(),
        };
        Ok((holder, lease, r))
    }

    /// Checks a holder block as [`from_block`](Holder::from_block) does, without building
    /// the holder: the bytes after the block.
    pub(crate) fn skip_block(b: &[u8]) -> Result<&[u8], RecordError> {
        let r = b.get(12..).ok_or(RecordError::LengthMismatch)?;
        let (_, r) = text(r)?;
        let (_, r) = text(r)?;
        Ok(r)
    }
}

/// A shared holder, as a coordinator passes it to every `begin`.
pub type SharedHolder = Arc<Holder>;

/// A holder block's text: `len:u8` then that many bytes of UTF-8.
fn text(b: &[u8]) -> Result<(&str, &[u8]), RecordError> {
    let (&len, r) = b.split_first().ok_or(RecordError::LengthMismatch)?;
    let (t, r) = r
        .split_at_checked(len as usize)
        .ok_or(RecordError::LengthMismatch)?;
    let t = std::str::from_utf8(t).map_err(|_| RecordError::InvalidField("holder"))?;
    // Only what `clean` writes: one record, one spelling.
    if t.len() > Holder::MAX_TEXT || t.chars().any(char::is_control) {
        return Err(RecordError::InvalidField("holder"));
    }
    Ok((t, r))
}

fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(Holder::MAX_TEXT));
    for c in text.chars() {
        let c = if c.is_control() { '?' } else { c };
        if out.len() + c.len_utf8() > Holder::MAX_TEXT {
            break;
        }
        out.push(c);
    }
    out
}
