//! libpq's rules for the server's certificate, where webpki's (rustls') differ
//! (docs/guarantees.md#database-and-connection-settings). Users follow PostgreSQL's manual
//! ("Creating Certificates") and check their set-up with psql; what psql accepts and refuses,
//! leaderrun accepts and refuses.
//!
//! * **A certificate that is itself a trusted root is trusted as it stands**, as OpenSSL
//!   trusts it. The manual's self-signed server certificate (`openssl req -x509`, which
//!   OpenSSL 3 marks `CA:TRUE`) is copied to the clients as their `sslrootcert`; webpki refuses
//!   any CA certificate as a server's (`CaUsedAsEndEntity`). Such a certificate must be within
//!   its validity period and fit a TLS server as OpenSSL's `ssl_server` purpose asks: a key
//!   usage, when present, allows digital signature, key encipherment or key agreement; an
//!   extended key usage, when present, names serverAuth (or one of the old SGC purposes).
//! * **`verify-full` matches the host name as libpq does** (`fe-secure-common.c`,
//!   `pgtls_verify_peer_name_matches_certificate_guts` in `fe-secure-openssl.c`): the subject
//!   alternative names of the host's type (DNS or IP) first; the Common Name only when there is
//!   none of that type, which is how the manual's certificates (a CN and no alternative names)
//!   are matched; names compared without regard to ASCII case; a wildcard only as a whole
//!   first label (`*.example.com` matches `db.example.com`, not `a.db.example.com`).

use std::net::IpAddr;
use std::sync::Arc;

use rustls::{CertificateError, OtherError};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::der::Decode;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{ExtendedKeyUsage, KeyUsage, KeyUsages, SubjectAltName};
use x509_cert::Certificate;

/// The Common Name attribute (X.520, `id-at-commonName`).
const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
/// Extended key usages OpenSSL takes for a TLS server: serverAuth (RFC 5280), Netscape's and
/// Microsoft's Server Gated Cryptography.
const SERVER_PURPOSES: [ObjectIdentifier; 3] = [
    ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.1"),
    ObjectIdentifier::new_unwrap("2.16.840.1.113730.4.1"),
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.311.10.3.3"),
];

/// The `tls-server-end-point` channel binding data of a server certificate (RFC 5929, 4.1):
/// its DER hashed with the hash of its signature algorithm, SHA-256 where that is MD5 or
/// SHA-1, as PostgreSQL's server computes it (`be_tls_get_certificate_hash`) for
/// `SCRAM-SHA-256-PLUS`. `None` for a certificate that does not parse or whose signature
/// algorithm names no hash this knows (RSASSA-PSS, Ed25519): the session then offers no
/// channel binding, and `channel_binding=require` refuses it.
pub(super) fn end_point_hash(der: &CertificateDer<'_>) -> Option<Vec<u8>> {
    use sha2::Digest;
    let cert = Certificate::from_der(der.as_ref()).ok()?;
    let oid = cert.signature_algorithm().oid.to_string();
    let bytes = der.as_ref();
    Some(match oid.as_str() {
        // MD5 and SHA-1 (RSA, ECDSA, DSA), and SHA-256: SHA-256.
        "1.2.840.113549.1.1.4"
        | "1.2.840.113549.1.1.5"
        | "1.2.840.10045.4.1"
        | "1.2.840.10040.4.3"
        | "1.2.840.113549.1.1.11"
        | "1.2.840.10045.4.3.2"
        | "2.16.840.1.101.3.4.3.2" => sha2::Sha256::digest(bytes).to_vec(),
        "1.2.840.113549.1.1.14" | "1.2.840.10045.4.3.1" | "2.16.840.1.101.3.4.3.1" => {
            sha2::Sha224::digest(bytes).to_vec()
        }
        "1.2.840.113549.1.1.12" | "1.2.840.10045.4.3.3" => sha2::Sha384::digest(bytes).to_vec(),
        "1.2.840.113549.1.1.13" | "1.2.840.10045.4.3.4" => sha2::Sha512::digest(bytes).to_vec(),
        _ => return None,
    })
}

/// Whether `end_entity` is, byte for byte, one of `trusted`, and if so whether it may serve
/// as it stands at `now`: `None` when it is not one of them (the chain's verdict stands),
/// else its validity period and purpose checked.
pub(super) fn trusted_as_is(
    end_entity: &CertificateDer<'_>,
    trusted: &[CertificateDer<'static>],
    now: UnixTime,
) -> Option<Result<(), CertificateError>> {
    if !trusted
        .iter()
        .any(|root| root.as_ref() == end_entity.as_ref())
    {
        return None;
    }
    let Ok(cert) = Certificate::from_der(end_entity.as_ref()) else {
        return Some(Err(CertificateError::BadEncoding));
    };
    let tbs = cert.tbs_certificate();
    let validity = tbs.validity();
    let period = (
        validity.not_before.to_unix_duration().as_secs(),
        validity.not_after.to_unix_duration().as_secs(),
    );
    let key_usage = match tbs.get_extension::<KeyUsage>() {
        Ok(found) => found.map(|(_, usage)| usage),
        Err(_) => return Some(Err(CertificateError::BadEncoding)),
    };
    let extended = match tbs.get_extension::<ExtendedKeyUsage>() {
        Ok(found) => found.map(|(_, usage)| usage),
        Err(_) => return Some(Err(CertificateError::BadEncoding)),
    };
    Some(usable(period, key_usage.as_ref(), extended.as_ref(), now))
}

/// OpenSSL's checks of a trusted certificate used as a TLS server's: `period` is
/// (notBefore, notAfter) in seconds since the epoch, both inclusive.
fn usable(
    (not_before, not_after): (u64, u64),
    key_usage: Option<&KeyUsage>,
    extended: Option<&ExtendedKeyUsage>,
    now: UnixTime,
) -> Result<(), CertificateError> {
    if now.as_secs() < not_before {
        return Err(CertificateError::NotValidYetContext {
            time: now,
            not_before: UnixTime::since_unix_epoch(std::time::Duration::from_secs(not_before)),
        });
    }
    if now.as_secs() > not_after {
        return Err(CertificateError::ExpiredContext {
            time: now,
            not_after: UnixTime::since_unix_epoch(std::time::Duration::from_secs(not_after)),
        });
    }
    let tls = KeyUsages::DigitalSignature | KeyUsages::KeyEncipherment | KeyUsages::KeyAgreement;
    if key_usage.is_some_and(|usage| (usage.0 & tls).is_empty()) {
        return Err(CertificateError::InvalidPurpose);
    }
    if extended.is_some_and(|usages| !usages.0.iter().any(|oid| SERVER_PURPOSES.contains(oid))) {
        return Err(CertificateError::InvalidPurpose);
    }
    Ok(())
}

/// The names a certificate presents, as libpq reads them.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct PeerNames {
    /// The DNS names and IP addresses of the subject alternative names, in order; other kinds
    /// of alternative name are not looked at.
    alternative: Vec<AltName>,
    /// The subject's first Common Name, its bytes as encoded.
    common_name: Option<Vec<u8>>,
}

/// One subject alternative name libpq looks at.
#[derive(Debug, PartialEq, Eq)]
enum AltName {
    /// A `dNSName`, its bytes as encoded.
    Dns(Vec<u8>),
    /// An `iPAddress`, in network byte order (4 or 16 bytes in a sound certificate).
    Ip(Vec<u8>),
}

impl PeerNames {
    /// Reads the names of a DER certificate.
    ///
    /// # Errors
    /// `BadEncoding` when the certificate or its alternative names do not parse.
    pub(super) fn of(der: &CertificateDer<'_>) -> Result<PeerNames, CertificateError> {
        let cert =
            Certificate::from_der(der.as_ref()).map_err(|_| CertificateError::BadEncoding)?;
        let tbs = cert.tbs_certificate();
        let alternative = match tbs.get_extension::<SubjectAltName>() {
            Ok(Some((_, names))) => names
                .0
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DnsName(dns) => Some(AltName::Dns(dns.as_bytes().to_vec())),
                    GeneralName::IpAddress(ip) => Some(AltName::Ip(ip.as_bytes().to_vec())),
                    _ => None,
                })
                .collect(),
            Ok(None) => Vec::new(),
            Err(_) => return Err(CertificateError::BadEncoding),
        };
        let common_name = tbs
            .subject()
            .iter()
            .find(|attribute| attribute.oid == COMMON_NAME)
            .map(|attribute| attribute.value.value().to_vec());
        Ok(PeerNames {
            alternative,
            common_name,
        })
    }

    /// Whether these names let a client that connected to `host` go on, by libpq's rules
    /// (the module's documentation).
    ///
    /// # Errors
    /// `NotValidForNameContext` with the names examined when none matches; `Other` when a
    /// name holds a NUL byte or an IP address is neither 4 nor 16 bytes (libpq refuses both).
    pub(super) fn check(&self, host: &ServerName<'_>) -> Result<(), CertificateError> {
        let (text, ip) = match host {
            ServerName::DnsName(name) => (name.as_ref().to_owned(), None),
            ServerName::IpAddress(ip) => {
                let ip = IpAddr::from(*ip);
                (ip.to_string(), Some(ip))
            }
            _ => (String::new(), None),
        };
        let mut examined = Vec::new();
        // libpq looks at the Common Name unless an alternative name of the host's own kind
        // exists, or one of any kind matched (or was refused).
        let mut check_common_name = true;
        for name in &self.alternative {
            let matched = match name {
                AltName::Dns(dns) => {
                    check_common_name &= ip.is_some();
                    examined.push(String::from_utf8_lossy(dns).into_owned());
                    name_matches(dns, text.as_bytes())?
                }
                AltName::Ip(bytes) => {
                    check_common_name &= ip.is_none();
                    let cert_ip = ip_of(bytes)?;
                    examined.push(cert_ip.to_string());
                    ip == Some(cert_ip)
                }
            };
            if matched {
                return Ok(());
            }
        }
        if check_common_name {
            if let Some(common_name) = &self.common_name {
                examined.push(String::from_utf8_lossy(common_name).into_owned());
                if name_matches(common_name, text.as_bytes())? {
                    return Ok(());
                }
            }
        }
        Err(CertificateError::NotValidForNameContext {
            expected: host.to_owned(),
            presented: examined,
        })
    }
}

fn refused(what: String) -> CertificateError {
    CertificateError::Other(OtherError(Arc::new(std::io::Error::other(what))))
}

/// An `iPAddress` name's address; libpq refuses other lengths than 4 and 16.
fn ip_of(bytes: &[u8]) -> Result<IpAddr, CertificateError> {
    match bytes.len() {
        4 => Ok(IpAddr::from(<[u8; 4]>::try_from(bytes).expect("4 bytes"))),
        16 => Ok(IpAddr::from(<[u8; 16]>::try_from(bytes).expect("16 bytes"))),
        n => Err(refused(format!(
            "certificate contains IP address with invalid length {n}"
        ))),
    }
}

/// libpq's `pq_verify_peer_name_matches_certificate_name`: equal without regard to ASCII
/// case, or a wildcard match; a name with a NUL byte is refused (CVE-2009-4034).
fn name_matches(name: &[u8], host: &[u8]) -> Result<bool, CertificateError> {
    if name.contains(&0) {
        return Err(refused(
            "SSL certificate's name contains embedded null".to_owned(),
        ));
    }
    Ok(name.eq_ignore_ascii_case(host) || wildcard_matches(name, host))
}

/// libpq's `wildcard_certificate_match`: `*.` then the rest, which must end `host` without
/// regard to ASCII case, and the `*` stands for one whole label (no dot).
fn wildcard_matches(pattern: &[u8], host: &[u8]) -> bool {
    if pattern.len() < 3 || !pattern.starts_with(b"*.") || pattern.len() > host.len() {
        return false;
    }
    // Where the pattern's `.rest` begins in `host`; no dot may come before the byte ahead
    // of it (libpq's test, which lets that byte itself be a dot).
    let rest = host.len() - pattern.len() + 1;
    pattern[1..].eq_ignore_ascii_case(&host[rest..])
        && host
            .iter()
            .position(|&b| b == b'.')
            .is_some_and(|dot| dot + 1 >= rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(alternative: Vec<AltName>, common_name: Option<&str>) -> PeerNames {
        PeerNames {
            alternative,
            common_name: common_name.map(|n| n.as_bytes().to_vec()),
        }
    }

    fn dns(name: &str) -> AltName {
        AltName::Dns(name.as_bytes().to_vec())
    }

    fn ip(text: &str) -> AltName {
        match text.parse::<IpAddr>().unwrap() {
            IpAddr::V4(v4) => AltName::Ip(v4.octets().to_vec()),
            IpAddr::V6(v6) => AltName::Ip(v6.octets().to_vec()),
        }
    }

    fn host(text: &str) -> ServerName<'static> {
        ServerName::try_from(text.to_owned()).unwrap()
    }

    #[test]
    fn wildcards_are_one_whole_first_label_as_in_libpq() {
        assert!(wildcard_matches(b"*.example.com", b"db.example.com"));
        assert!(wildcard_matches(b"*.Example.COM", b"DB.example.com"));
        assert!(!wildcard_matches(b"*.example.com", b"a.db.example.com"));
        assert!(!wildcard_matches(b"*.example.com", b"example.com"));
        assert!(!wildcard_matches(b"db*.example.com", b"db1.example.com"));
        assert!(!wildcard_matches(b"*", b"db"));
        assert!(!wildcard_matches(b"*.com", b"db.example.com"));
        assert!(!wildcard_matches(b"*.example.com", b"dbexample.com"));
    }

    #[test]
    fn the_common_name_counts_only_without_an_alternative_name_of_the_hosts_kind() {
        // The manual's certificates: a CN, no alternative names.
        assert!(names(vec![], Some("db.example.com"))
            .check(&host("DB.example.com"))
            .is_ok());
        // A DNS alternative name hides the CN from a DNS host...
        let both = names(vec![dns("other.example.com")], Some("db.example.com"));
        let err = both.check(&host("db.example.com")).unwrap_err();
        assert!(
            matches!(&err, CertificateError::NotValidForNameContext { presented, .. }
                if presented == &["other.example.com".to_owned()]),
            "{err:?}"
        );
        // ...but not from an IP host, and an IP alternative name hides it from an IP host.
        assert!(names(vec![dns("db")], Some("127.0.0.1"))
            .check(&host("127.0.0.1"))
            .is_ok());
        assert!(names(vec![ip("10.0.0.1")], Some("127.0.0.1"))
            .check(&host("127.0.0.1"))
            .is_err());
        assert!(names(vec![ip("10.0.0.1")], Some("db"))
            .check(&host("db"))
            .is_ok());
    }

    #[test]
    fn addresses_compare_as_addresses_and_names_as_text() {
        assert!(names(vec![dns("x"), ip("::1")], None)
            .check(&host("::1"))
            .is_ok());
        assert!(names(vec![ip("127.0.0.1")], None)
            .check(&host("127.0.0.1"))
            .is_ok());
        // libpq compares a DNS name with the host as typed, even an address.
        assert!(names(vec![dns("127.0.0.1")], None)
            .check(&host("127.0.0.1"))
            .is_ok());
        assert!(names(vec![ip("127.0.0.1")], None)
            .check(&host("localhost"))
            .is_err());
        let err = names(vec![], None).check(&host("db")).unwrap_err();
        assert!(
            matches!(&err, CertificateError::NotValidForNameContext { presented, .. } if presented.is_empty()),
            "{err:?}"
        );
    }

    #[test]
    fn names_libpq_refuses_are_refused() {
        let nul = names(vec![dns("db\0.evil.example")], None);
        assert!(matches!(
            nul.check(&host("db")),
            Err(CertificateError::Other(_))
        ));
        let odd = names(vec![AltName::Ip(vec![127, 0, 0])], Some("db"));
        assert!(matches!(
            odd.check(&host("db")),
            Err(CertificateError::Other(_))
        ));
        // A match before the bad entry ends the look, as libpq's loop does.
        let first = names(vec![dns("db"), AltName::Ip(vec![1])], None);
        assert!(first.check(&host("db")).is_ok());
    }

    #[test]
    fn a_trusted_certificate_is_used_as_it_stands_only_in_its_period_and_for_a_server() {
        let at = |s: u64| UnixTime::since_unix_epoch(std::time::Duration::from_secs(s));
        assert!(usable((100, 200), None, None, at(100)).is_ok());
        assert!(usable((100, 200), None, None, at(200)).is_ok());
        assert!(matches!(
            usable((100, 200), None, None, at(99)),
            Err(CertificateError::NotValidYetContext { .. })
        ));
        assert!(matches!(
            usable((100, 200), None, None, at(201)),
            Err(CertificateError::ExpiredContext { .. })
        ));
        let signing_only = KeyUsage(KeyUsages::KeyCertSign | KeyUsages::CRLSign);
        assert_eq!(
            usable((0, 9), Some(&signing_only), None, at(5)),
            Err(CertificateError::InvalidPurpose)
        );
        let tls = KeyUsage(KeyUsages::KeyCertSign | KeyUsages::DigitalSignature);
        assert!(usable((0, 9), Some(&tls), None, at(5)).is_ok());
        let client = ExtendedKeyUsage(vec![ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.2")]);
        assert_eq!(
            usable((0, 9), None, Some(&client), at(5)),
            Err(CertificateError::InvalidPurpose)
        );
        let server = ExtendedKeyUsage(vec![SERVER_PURPOSES[0]]);
        assert!(usable((0, 9), None, Some(&server), at(5)).is_ok());
    }
}
