//! Typed blake3 digests.
//!
//! A `Digest<Artifact>` names the bytes of a stored object; a `Digest<NodeKey>` names a node's
//! key material. The type tag makes it impossible to look an object up by a node key or the
//! other way round (the habit is buck2's).

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Tag for digests of stored object bytes (plain blake3 of the bytes, so `b3sum` agrees).
#[derive(Debug)]
pub enum Artifact {}

/// Tag for digests of a node's canonical key material.
#[derive(Debug)]
pub enum NodeKeyTag {}

/// A 32-byte blake3 digest tagged with what it hashes.
pub struct Digest<T> {
    bytes: [u8; 32],
    _tag: PhantomData<fn() -> T>,
}

impl<T> Digest<T> {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self {
            bytes,
            _tag: PhantomData,
        }
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.bytes {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// The first 12 hex characters, for logs and tables.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }
}

impl Digest<Artifact> {
    /// Digest of object bytes.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self::from_bytes(*blake3::hash(bytes).as_bytes())
    }
}

impl<T> Clone for Digest<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Digest<T> {}
impl<T> PartialEq for Digest<T> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}
impl<T> Eq for Digest<T> {}
impl<T> std::hash::Hash for Digest<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes.hash(state)
    }
}
impl<T> PartialOrd for Digest<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Digest<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bytes.cmp(&other.bytes)
    }
}

impl<T> fmt::Debug for Digest<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

impl<T> fmt::Display for Digest<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Error for a malformed hex digest.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a 64-character hex digest")]
pub struct BadDigest(pub String);

impl<T> FromStr for Digest<T> {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadDigest(s.to_string()));
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| BadDigest(s.to_string()))?;
        }
        Ok(Self::from_bytes(bytes))
    }
}

impl<T> Serialize for Digest<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de, T> Deserialize<'de> for Digest<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_matches_plain_blake3() {
        let d = Digest::<Artifact>::of_bytes(b"hello");
        assert_eq!(d.to_hex(), blake3::hash(b"hello").to_hex().to_string());
        let back: Digest<Artifact> = d.to_hex().parse().unwrap();
        assert_eq!(back, d);
        assert_eq!(d.short().len(), 12);
    }

    #[test]
    fn malformed_hex_is_rejected() {
        assert!("abc".parse::<Digest<Artifact>>().is_err());
        assert!("z".repeat(64).parse::<Digest<Artifact>>().is_err());
    }
}
