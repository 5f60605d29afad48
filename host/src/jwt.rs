//! Client assertions (RFC 7523, `private_key_jwt`): a `client-credentials`
//! connection proves who it is with a short-lived JWT signed by its private
//! key, so no shared secret ever leaves the host.
//!
//! The key is a PKCS#8 PEM file (or secret): EC P-256 (`ES256`), EC P-384
//! (`ES384`), RSA (`RS256`) or Ed25519 (`EdDSA`), told apart by signing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

/// How long an assertion is good for: the token request that carries it.
const LIFETIME: Duration = Duration::from_secs(300);

/// The assertion type of RFC 7523 section 2.2.
pub(crate) const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// A client's private key and the algorithm it signs with.
pub(crate) struct Signer {
    key: EncodingKey,
    alg: Algorithm,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("alg", &self.alg).finish()
    }
}

impl Signer {
    /// Reads a PKCS#8 PEM private key, and finds its algorithm by signing
    /// with each that fits the key's type.
    ///
    /// # Errors
    /// What the key is not (never quoting it).
    pub(crate) fn from_pem(pem: &str) -> Result<Signer, String> {
        let pem = pem.as_bytes();
        let candidates = [
            (EncodingKey::from_ec_pem(pem), Algorithm::ES256),
            (EncodingKey::from_ec_pem(pem), Algorithm::ES384),
            (EncodingKey::from_rsa_pem(pem), Algorithm::RS256),
            (EncodingKey::from_ed_pem(pem), Algorithm::EdDSA),
        ];
        for (key, alg) in candidates {
            let Ok(key) = key else { continue };
            let signer = Signer { key, alg };
            if signer.assertion("probe", "probe").is_ok() {
                return Ok(signer);
            }
        }
        Err(
            "not a PKCS#8 PEM private key of a kind that signs client assertions \
             (EC P-256, EC P-384, RSA of 2048 bits or more, or Ed25519; \
             `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` makes one, \
             and `openssl pkcs8 -topk8 -nocrypt` turns a `BEGIN EC PRIVATE KEY` or \
             `BEGIN RSA PRIVATE KEY` file into PKCS#8)"
                .to_owned(),
        )
    }

    /// The JWS name of the algorithm (`ES256`, …).
    pub(crate) fn alg(&self) -> &'static str {
        match self.alg {
            Algorithm::ES256 => "ES256",
            Algorithm::ES384 => "ES384",
            Algorithm::RS256 => "RS256",
            _ => "EdDSA",
        }
    }

    /// A fresh assertion for `client_id` (its issuer and subject) to present
    /// to the authorization server `audience` (its issuer identifier).
    ///
    /// # Errors
    /// Why the key could not sign.
    pub(crate) fn assertion(&self, client_id: &str, audience: &str) -> Result<String, String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let claims = json!({
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "iat": now,
            "exp": now + LIFETIME.as_secs(),
            // Unique per assertion, so a server that remembers them can
            // refuse a replay (RFC 7523 section 3, item 7).
            "jti": format!("{:032x}", rand::random::<u128>()),
        });
        jsonwebtoken::encode(&Header::new(self.alg), &claims, &self.key)
            .map_err(|e| format!("cannot sign the client assertion: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A throwaway P-256 key (`openssl genpkey -algorithm EC -pkeyopt
    // ec_paramgen_curve:P-256`), used nowhere else.
    const P256: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgJX2z637btX4jO/Of
m1RTjYO+uPhMvVhKkPt4CiQtGSWhRANCAAS60fHlRay1kmD1MxchkLjsiDzBnAGy
ZfgchHz0sTUzIRJJMNP+ZWmqorLYIXcsSuaSMCvR6F9pvQJwOVyN99q4
-----END PRIVATE KEY-----
";

    fn claims(jwt: &str) -> serde_json::Value {
        use base64::Engine as _;
        let payload = jwt.split('.').nth(1).unwrap();
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn an_ec_key_signs_es256_assertions_naming_the_client_and_the_server() {
        let signer = Signer::from_pem(P256).unwrap();
        assert_eq!(signer.alg(), "ES256");
        let jwt = signer.assertion("client-7", "https://as.example").unwrap();
        let claims = claims(&jwt);
        assert_eq!(claims["iss"], "client-7");
        assert_eq!(claims["sub"], "client-7");
        assert_eq!(claims["aud"], "https://as.example");
        let lifetime = claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap();
        assert_eq!(lifetime, 300);
        let again = claims_of(&signer);
        assert_ne!(claims["jti"], again["jti"], "each assertion is unique");
    }

    fn claims_of(signer: &Signer) -> serde_json::Value {
        claims(&signer.assertion("client-7", "https://as.example").unwrap())
    }

    #[test]
    fn what_is_not_a_private_key_is_refused_without_being_quoted() {
        for text in [
            "hunter2-not-a-key",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ] {
            let error = Signer::from_pem(text).unwrap_err();
            assert!(error.contains("PKCS#8 PEM private key"), "{error}");
            assert!(!error.contains("hunter2"), "{error}");
        }
    }
}
