//! Bearer-token authentication: one token per line in the token file (blank lines and `#` comments
//! ignored); calls carry `authorization: Bearer <token>`, compared in constant time against every
//! accepted token.

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
    /// Tokens from a list. Errors: [`ServiceError::Config`] for an empty list, a token shorter than
    /// [`MIN_TOKEN_LEN`] bytes or with characters not allowed in a header.
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

    /// Reads a token file. Errors: [`ServiceError::Io`], then those of [`TokenSet::new`].
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

    /// Whether `presented` is one of the tokens (constant time in the token contents; all tokens
    /// are compared).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        self.find(presented).is_some()
    }

    /// The index of `presented` in the set (its [`Principal`]), compared in constant time against
    /// every token.
    pub fn find(&self, presented: &[u8]) -> Option<Principal> {
        use subtle::ConditionallySelectable;
        let mut index = u32::MAX;
        for (i, t) in self.tokens.iter().enumerate() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            index = u32::conditional_select(&index, &i, t.as_slice().ct_eq(presented));
        }
        (index != u32::MAX).then_some(Principal(index))
    }
}

/// Who made a call: its bearer token's index in the [`TokenSet`] ([`Principal::ANONYMOUS`] without
/// authentication); limits are kept per principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Principal(pub u32);

impl Principal {
    /// Every caller of a server without authentication.
    pub const ANONYMOUS: Principal = Principal(u32::MAX);

    /// The principal the interceptor attached to `req`.
    pub(crate) fn of<T>(req: &Request<T>) -> Principal {
        req.extensions()
            .get::<Principal>()
            .copied()
            .unwrap_or(Principal::ANONYMOUS)
    }
}

/// Rejected calls are logged at WARN at most once per interval, others at DEBUG.
const REJECTION_WARN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// When the last WARN line about a rejected token was written, and how many rejections were logged
/// at DEBUG since.
#[derive(Debug, Default)]
pub(crate) struct RejectionLog {
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl RejectionLog {
    /// Logs one rejection: WARN if none was logged at WARN within [`REJECTION_WARN_INTERVAL`], else
    /// DEBUG.
    pub(crate) fn rejected(&self, remote: Option<std::net::SocketAddr>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let due =
            st.0.is_none_or(|t| now.duration_since(t) >= REJECTION_WARN_INTERVAL);
        if due {
            let suppressed = st.1;
            *st = (Some(now), 0);
            drop(st);
            tracing::warn!(
                ?remote,
                suppressed,
                "rejected call: missing or wrong bearer token (further rejections within a minute at DEBUG)"
            );
        } else {
            st.1 += 1;
            drop(st);
            tracing::debug!(?remote, "rejected call: missing or wrong bearer token");
        }
    }
}

#[derive(Clone)]
pub(crate) struct AuthInterceptor {
    pub(crate) tokens: Option<Arc<TokenSet>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) rejections: Arc<RejectionLog>,
}

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let Some(tokens) = &self.tokens else {
            req.extensions_mut().insert(Principal::ANONYMOUS);
            return Ok(req);
        };
        let principal = req
            .metadata()
            .get(AUTHORIZATION_KEY)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .and_then(|tok| tokens.find(tok));
        match principal {
            Some(p) => {
                req.extensions_mut().insert(p);
                Ok(req)
            }
            None => {
                self.metrics.auth_failure();
                self.rejections.rejected(req.remote_addr());
                Err(status(
                    Code::Unauthenticated,
                    ErrorReason::Unauthenticated,
                    "missing or wrong bearer token",
                ))
            }
        }
    }
}

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
