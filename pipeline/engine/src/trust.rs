//! Who a result is trusted from: ed25519 signatures on manifests and the policy a store or a
//! remote applies to them (the model of Nix's binary caches: every result is signed by the
//! key of whoever computed it, and a reader serves only what a key it trusts vouches for).
//!
//! A signature covers the manifest's seal, which binds its node key (and so its key material)
//! to the digest and size of every output, so a signed result cannot be pointed at other
//! objects, filed under another key, or have its signature moved to another result. What is
//! not signed — provenance, the summary of small facts — is never used to serve a result.
//!
//! Keys are written as Nix writes them: `NAME:BASE64`, the public key 32 bytes, the secret 32
//! bytes (the seed). `NAME` is free text without `:` or spaces (`alice@hpc`, `team-ci-2026`).

use std::collections::BTreeSet;
use std::sync::Mutex;

use base64::Engine as _;
use ed25519_dalek::{Signer as _, Verifier as _};
use serde::{Deserialize, Serialize};

use crate::store::Manifest;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// What a signature signs: a domain tag, then the seal (see [`Manifest::seal_of`]).
fn message(seal: &str) -> Vec<u8> {
    let mut m = b"upcc result signature v1\0".to_vec();
    m.extend_from_slice(seal.as_bytes());
    m
}

/// A key name: what is left of the `:`, free text without spaces.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 100 {
        return Err("its name (before the `:`) must be 1 to 100 characters".into());
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c == ':' || c.is_control())
    {
        return Err(
            "its name (before the `:`) must have no spaces, `:` or control characters".into(),
        );
    }
    Ok(())
}

fn split_key(text: &str) -> Result<(&str, [u8; 32]), String> {
    let text = text.trim();
    let (name, b64) = text
        .rsplit_once(':')
        .ok_or("it is not NAME:BASE64 (no `:`)")?;
    check_name(name)?;
    let raw = B64
        .decode(b64)
        .map_err(|e| format!("the part after the `:` is not base64 ({e})"))?;
    let bytes: [u8; 32] = raw
        .try_into()
        .map_err(|r: Vec<u8>| format!("the key is {} bytes; an ed25519 key is 32", r.len()))?;
    Ok((name, bytes))
}

/// A public key that verifies results: `NAME:BASE64`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    name: String,
    key: ed25519_dalek::VerifyingKey,
}

impl PublicKey {
    pub fn name(&self) -> &str {
        &self.name
    }

    fn verify(&self, seal: &str, sig: &[u8]) -> bool {
        let Ok(sig) = ed25519_dalek::Signature::from_slice(sig) else {
            return false;
        };
        self.key.verify(&message(seal), &sig).is_ok()
    }
}

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.name, B64.encode(self.key.as_bytes()))
    }
}

impl std::str::FromStr for PublicKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, bytes) = split_key(s)?;
        let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes)
            .map_err(|_| "those 32 bytes are not an ed25519 public key".to_string())?;
        Ok(PublicKey {
            name: name.to_string(),
            key,
        })
    }
}

/// A secret key that signs the results its holder computes. Its text form (`NAME:BASE64` of the
/// 32-byte seed) lives in a file only its owner can read.
pub struct SecretKey {
    name: String,
    key: ed25519_dalek::SigningKey,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", self.public())
    }
}

impl SecretKey {
    /// A new key named `name`, from the operating system's random source.
    pub fn generate(name: &str) -> Result<Self, String> {
        check_name(name)?;
        let mut seed = [0u8; 32];
        let mut filled = 0;
        while filled < seed.len() {
            // SAFETY: the pointer and length describe the unfilled tail of `seed`.
            let n = unsafe {
                libc::getrandom(seed[filled..].as_mut_ptr().cast(), seed.len() - filled, 0)
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!("the system's random source failed: {e}"));
            }
            filled += n as usize;
        }
        Ok(SecretKey {
            name: name.to_string(),
            key: ed25519_dalek::SigningKey::from_bytes(&seed),
        })
    }

    /// The text form, for the key file (secret: keep it 0600).
    pub fn to_text(&self) -> String {
        format!("{}:{}", self.name, B64.encode(self.key.to_bytes()))
    }

    pub fn public(&self) -> PublicKey {
        PublicKey {
            name: self.name.clone(),
            key: self.key.verifying_key(),
        }
    }

    /// The signature record of a manifest with seal `seal`.
    pub fn sign(&self, seal: &str) -> SignatureRecord {
        SignatureRecord {
            key: self.public().to_string(),
            sig: B64.encode(self.key.sign(&message(seal)).to_bytes()),
        }
    }
}

impl std::str::FromStr for SecretKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, seed) = split_key(s)?;
        Ok(SecretKey {
            name: name.to_string(),
            key: ed25519_dalek::SigningKey::from_bytes(&seed),
        })
    }
}

/// A manifest's signature: the signer's public key and the signature of its seal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureRecord {
    /// `NAME:BASE64` of the public key that signed.
    pub key: String,
    /// base64 of the 64-byte ed25519 signature.
    pub sig: String,
}

/// Which writers' results a store or a remote serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Only results signed by a trusted key (the default).
    #[default]
    Signed,
    /// Every result whose seal holds, signed or not, by anyone: every writer is trusted. An
    /// explicit choice (`trust: {store: any}`), for a store only its owner can write.
    Any,
}

/// Why a reader does not serve a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Distrust {
    /// Nobody signed it (a writer without a key, or a result from before signatures).
    Unsigned,
    /// Signed, and the signature verifies, by a key the reader does not trust.
    UntrustedKey(String),
    /// It carries a signature that does not verify (edited after signing, or forged).
    BadSignature(String),
}

impl Distrust {
    /// Whether the result is damaged or forged (then a remote copy is replaced by a good one),
    /// rather than honestly signed by someone the reader does not know.
    pub fn is_forged(&self) -> bool {
        !matches!(self, Distrust::UntrustedKey(_))
    }

    /// The key (or "no key") in one short phrase for messages.
    pub fn signer(&self) -> String {
        match self {
            Distrust::Unsigned => "nobody (unsigned)".to_string(),
            Distrust::UntrustedKey(k) => format!("`{}`", short_key(k)),
            Distrust::BadSignature(k) => {
                format!("`{}` with a signature that does not verify", short_key(k))
            }
        }
    }
}

/// `name:AbCdEfGh…` (the first 8 base64 characters): enough to tell keys apart in a message.
pub fn short_key(key: &str) -> String {
    match key.rsplit_once(':') {
        Some((name, b64)) if b64.len() > 8 => format!("{name}:{}…", &b64[..8]),
        _ => key.to_string(),
    }
}

/// What a store or a remote trusts, and the key this process signs with.
#[derive(Debug)]
pub struct Trust {
    policy: Policy,
    keys: Vec<PublicKey>,
    signer: Option<SecretKey>,
    /// Where the reader's trust is configured, for the hint of a refusal.
    configured_in: String,
    /// Signers already reported by this process (one warning each).
    warned: Mutex<BTreeSet<String>>,
}

impl Default for Trust {
    /// Trust every writer, sign nothing: the engine's own tests and callers that set no policy.
    fn default() -> Self {
        Trust::new(Policy::Any, Vec::new(), None, String::new())
    }
}

impl Trust {
    /// A policy over `keys` (the signer's own public key is always trusted).
    pub fn new(
        policy: Policy,
        keys: Vec<PublicKey>,
        signer: Option<SecretKey>,
        configured_in: String,
    ) -> Self {
        Trust {
            policy,
            keys,
            signer,
            configured_in,
            warned: Mutex::new(BTreeSet::new()),
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The key this process signs its results with, if it has one.
    pub fn signer(&self) -> Option<&SecretKey> {
        self.signer.as_ref()
    }

    /// The public keys trusted, the signer's own first.
    pub fn trusted_keys(&self) -> Vec<PublicKey> {
        let mut out: Vec<PublicKey> = self.signer.iter().map(SecretKey::public).collect();
        for k in &self.keys {
            if !out.contains(k) {
                out.push(k.clone());
            }
        }
        out
    }

    /// Whether a manifest (whose seal already holds) carries a valid signature, and by whom.
    pub fn signature_of(m: &Manifest) -> Result<PublicKey, Distrust> {
        let (Some(sig), Some(seal)) = (&m.signature, &m.seal) else {
            return Err(Distrust::Unsigned);
        };
        let bad = || Distrust::BadSignature(sig.key.clone());
        let key: PublicKey = sig.key.parse().map_err(|_| bad())?;
        let raw = B64.decode(&sig.sig).map_err(|_| bad())?;
        if key.verify(seal, &raw) {
            Ok(key)
        } else {
            Err(bad())
        }
    }

    /// Whether this reader serves `m` (a manifest whose seal holds).
    pub fn check(&self, m: &Manifest) -> Result<(), Distrust> {
        if self.policy == Policy::Any {
            return Ok(());
        }
        let key = Self::signature_of(m)?;
        let own = self.signer.as_ref().map(SecretKey::public);
        if own.as_ref() == Some(&key) || self.keys.contains(&key) {
            Ok(())
        } else {
            Err(Distrust::UntrustedKey(key.to_string()))
        }
    }

    /// The warning for a refused result, once per signer and process (`None` when this signer
    /// was already reported). `what` names the place (`the store`, `remote s3://…`).
    pub fn refusal_warning(&self, what: &str, why: &Distrust) -> Option<String> {
        let signer = why.signer();
        if !self
            .warned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(signer.clone())
        {
            return None;
        }
        let fix = match why {
            Distrust::UntrustedKey(k) => format!(
                "to trust that key, add `{k}` to `trust.keys` ({})",
                self.configured_in
            ),
            Distrust::Unsigned => format!(
                "upcc signs each result with the key of whoever computed it; results without a signature were written before signing existed or with `trust: any`; to serve them, set `trust: {{store: any}}` or `{{remote: any}}` ({})",
                self.configured_in
            ),
            Distrust::BadSignature(_) => {
                "a result edited after it was signed, or a forged one".to_string()
            }
        };
        Some(format!(
            "results in {what} signed by {signer} are not trusted and are computed here instead ({fix})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_bad_text_is_named() {
        let sk = SecretKey::generate("alice@hpc").unwrap();
        let again: SecretKey = sk.to_text().parse().unwrap();
        assert_eq!(again.public(), sk.public());
        let pk: PublicKey = sk.public().to_string().parse().unwrap();
        assert_eq!(pk, sk.public());
        assert!("nocolon"
            .parse::<PublicKey>()
            .unwrap_err()
            .contains("NAME:BASE64"));
        assert!("a b:AAAA"
            .parse::<PublicKey>()
            .unwrap_err()
            .contains("spaces"));
        assert!("a:AAAA".parse::<PublicKey>().unwrap_err().contains("32"));
        assert!("a:!!".parse::<PublicKey>().unwrap_err().contains("base64"));
        assert_ne!(
            SecretKey::generate("x").unwrap().public(),
            SecretKey::generate("x").unwrap().public(),
            "two generated keys differ"
        );
    }

    #[test]
    fn a_signature_covers_the_seal_only_under_its_own_key() {
        let sk = SecretKey::generate("a").unwrap();
        let other = SecretKey::generate("b").unwrap();
        let rec = sk.sign("seal-one");
        let pk: PublicKey = rec.key.parse().unwrap();
        let sig = B64.decode(&rec.sig).unwrap();
        assert!(pk.verify("seal-one", &sig));
        assert!(!pk.verify("seal-two", &sig), "another seal");
        assert!(!other.public().verify("seal-one", &sig), "another key");
    }
}
