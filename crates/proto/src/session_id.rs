//! Session identifiers.

use crate::ProtoError;

/// A 128-bit session id from the OS CSPRNG; a capability, so `Debug` and [`SessionId::tag`] show
/// only a short prefix.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId(pub [u8; 16]);

impl SessionId {
    /// Parses a session id from the wire. Errors: [`ProtoError::SessionIdLength`] unless `bytes`
    /// has exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, ProtoError> {
        let arr: [u8; 16] = bytes
            .try_into()
            .map_err(|_| ProtoError::SessionIdLength { got: bytes.len() })?;
        Ok(Self(arr))
    }

    /// The wire form (16 bytes).
    pub fn to_bytes(self) -> bytes::Bytes {
        bytes::Bytes::copy_from_slice(&self.0)
    }

    /// A short, log-safe tag: the first 4 bytes in hex.
    pub fn tag(&self) -> String {
        self.0[..4].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionId({}…)", self.tag())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_id_round_trips_and_rejects_wrong_lengths() {
        let id = SessionId([7; 16]);
        assert_eq!(SessionId::from_slice(&id.to_bytes()).unwrap(), id);
        assert_eq!(
            SessionId::from_slice(&[0; 15]),
            Err(ProtoError::SessionIdLength { got: 15 })
        );
        assert_eq!(format!("{id:?}"), "SessionId(07070707…)");
    }
}
