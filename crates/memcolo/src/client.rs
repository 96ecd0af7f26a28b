//! A small blocking client of the agent's socket for the CLI's one-shot commands.

use anyhow::{bail, Context, Result};
use memcolo_proto::{decode_reply, encode, Reply, Request};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// One connection to the agent.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    /// Connects to the agent at `socket`, with a clear error when none runs there.
    pub fn connect(socket: &Path) -> Result<Client> {
        let s = UnixStream::connect(socket).with_context(|| {
            format!(
                "cannot reach the memcolo agent at {} (is `memcolo agent` running? --socket sets the path)",
                socket.display()
            )
        })?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    /// Sends `req` and returns its reply, skipping notifications that arrive first.
    pub fn call(&mut self, req: &Request) -> Result<Reply> {
        self.writer.write_all(encode(req).as_bytes())?;
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line)? == 0 {
                bail!("the agent closed the connection");
            }
            match decode_reply(&line).context("malformed reply from the agent")? {
                Reply::Notify { .. } => continue,
                r => return Ok(r),
            }
        }
    }

    /// Like [`Client::call`], but an error reply is an `Err`.
    pub fn call_ok(&mut self, req: &Request) -> Result<Reply> {
        match self.call(req)? {
            Reply::Error { code, message } => bail!("agent refused: {message} ({code:?})"),
            r => Ok(r),
        }
    }
}
