//! Bearer-token authentication.
//!
//! The token file holds one token per line (blank lines and `#` comments
//! ignored). Every call must carry `authorization: Bearer <token>`. Tokens are
//! compared in constant time against every accepted token (no early exit);
//! only a token's length can leak through timing.

use std::path::Path;
use std::sync::Arc;

use cipherlora_proto::{AUTHORIZATION_KEY, ErrorReason};
use subtle::ConstantTimeEq;
use tonic::{Code, Request, Status};

use crate::error::{Result, ServiceError};
use crate::metrics::Metrics;
use crate::status::status;

/// The accepted bearer tokens. `Debug` shows only their number.
#[derive(Clone)]
pub struct TokenSet {
    tokens: Vec<Vec<u8>>,
}

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenSet({} tokens)", self.tokens.len())
    }
}

/// Shortest token accepted, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;

impl TokenSet {
    /// Tokens from a list.
    ///
    /// # Errors
    /// [`ServiceError::Config`] when the list is empty, a token is shorter than
    /// [`MIN_TOKEN_LEN`] bytes or contains characters not allowed in an HTTP
    /// header value.
    pub fn new<S: AsRef<str>>(tokens: &[S]) -> Result<Self> {
        let mut out = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            let t = t.as_ref();
            if t.len() < MIN_TOKEN_LEN {
                return Err(ServiceError::Config {
                    reason: format!("token {i} is shorter than {MIN_TOKEN_LEN} bytes"),
                });
            }
            if !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ServiceError::Config {
                    reason: format!("token {i} contains whitespace or non-ASCII bytes"),
                });
            }
            out.push(t.as_bytes().to_vec());
        }
        if out.is_empty() {
            return Err(ServiceError::Config {
                reason: "no token given".into(),
            });
        }
        Ok(Self { tokens: out })
    }

    /// Reads a token file (one token per line; blank lines and `#` comments
    /// ignored).
    ///
    /// # Errors
    /// [`ServiceError::Io`], then the errors of [`TokenSet::new`].
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ServiceError::io(format!("reading token file {}", path.display()), e))?;
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        Self::new(&lines)
    }

    /// Whether `presented` is one of the tokens (constant time in the token
    /// contents; all tokens are compared).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0u8);
        for t in &self.tokens {
            ok |= t.as_slice().ct_eq(presented);
        }
        ok.into()
    }
}

/// Server-side interceptor: rejects calls without a valid bearer token with
/// `UNAUTHENTICATED`. With no token set, every call passes.
#[derive(Clone)]
pub(crate) struct AuthInterceptor {
    pub(crate) tokens: Option<Arc<TokenSet>>,
    pub(crate) metrics: Arc<Metrics>,
}

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(req);
        };
        let presented = req
            .metadata()
            .get(AUTHORIZATION_KEY)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        match presented {
            Some(tok) if tokens.accepts(tok) => Ok(req),
            _ => {
                self.metrics.auth_failure();
                tracing::warn!(
                    remote = ?req.remote_addr(),
                    "rejected call: missing or wrong bearer token"
                );
                Err(status(
                    Code::Unauthenticated,
                    ErrorReason::Unauthenticated,
                    "missing or wrong bearer token",
                ))
            }
        }
    }
}

/// Client-side interceptor: adds `authorization: Bearer <token>`.
#[derive(Clone)]
pub(crate) struct BearerToken {
    pub(crate) value: Option<tonic::metadata::AsciiMetadataValue>,
}

impl BearerToken {
    pub(crate) fn new(token: Option<&str>) -> Result<Self> {
        let value = token
            .map(|t| {
                format!("Bearer {t}")
                    .parse::<tonic::metadata::AsciiMetadataValue>()
                    .map_err(|_| ServiceError::Config {
                        reason: "token is not a valid header value".into(),
                    })
            })
            .transpose()?;
        Ok(Self { value })
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = &self.value {
            let mut v = v.clone();
            v.set_sensitive(true);
            req.metadata_mut().insert(AUTHORIZATION_KEY, v);
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_set_accepts_exactly_its_tokens() {
        let set = TokenSet::new(&["0123456789abcdef", "fedcba9876543210xyz"]).unwrap();
        assert!(set.accepts(b"0123456789abcdef"));
        assert!(set.accepts(b"fedcba9876543210xyz"));
        assert!(!set.accepts(b"0123456789abcdeF"));
        assert!(!set.accepts(b"0123456789abcde"));
        assert!(!set.accepts(b""));
    }

    #[test]
    fn short_or_empty_token_lists_are_refused() {
        assert!(matches!(
            TokenSet::new(&["short"]),
            Err(ServiceError::Config { .. })
        ));
        assert!(matches!(
            TokenSet::new::<&str>(&[]),
            Err(ServiceError::Config { .. })
        ));
        assert!(matches!(
            TokenSet::new(&["has a space in it!!"]),
            Err(ServiceError::Config { .. })
        ));
    }
}
