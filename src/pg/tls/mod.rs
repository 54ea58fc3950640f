//! TLS for the election's sessions: rustls with the `ring` provider, plugged into
//! tokio-postgres, with libpq's `sslmode` semantics
//! (docs/guarantees.md#database-and-connection-settings).
//!
//! | sslmode | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | no | — |
//! | `prefer` | if the server offers it | no; with `sslrootcert` given, the chain, and plaintext when it fails (libpq) |
//! | `require` | yes | no; with `sslrootcert` given, like `verify-ca` (libpq) |
//! | `verify-ca` | yes | chain to the root (`sslrootcert`, else the system's roots) |
//! | `verify-full` | yes | chain, and the host name or IP the client connected to |
//!
//! The chain is webpki's, except that a certificate that is itself a trusted root is trusted
//! as it stands, and the name is matched by libpq's rules, not webpki's (`tls::peer`).
//! `sslrootcert=system` names the system's roots (libpq 16). `sslcert`/`sslkey` give a client
//! certificate (PEM). A failed verification fails the connect with the reason in the error
//! chain. As with libpq, a Unix-socket connection never uses TLS.

mod peer;

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, unverified (libpq's default).
    #[default]
    Prefer,
    /// TLS, unverified unless a root certificate is named.
    Require,
    /// TLS, chain verified.
    VerifyCa,
    /// TLS, chain and host name verified.
    VerifyFull,
}

impl std::str::FromStr for SslMode {
    type Err = String;
    fn from_str(text: &str) -> Result<SslMode, String> {
        Ok(match text {
            "disable" => SslMode::Disable,
            // libpq's `allow` tries plaintext first; TLS-when-offered is the closer safe match.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(format!("invalid sslmode {other:?}")),
        })
    }
}

/// The TLS part of the connection settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`: PEM file of trusted roots; `None`, or the path [`SYSTEM_ROOTS`], means
    /// the system's roots.
    pub root_cert: Option<PathBuf>,
    /// `sslcert`: PEM client certificate chain.
    pub client_cert: Option<PathBuf>,
    /// `sslkey`: PEM private key of the client certificate.
    pub client_key: Option<PathBuf>,
    /// Where to connect, host by host, with each host's password: TLS is decided per host
    /// (never on a Unix socket), so the plan travels with the TLS settings.
    pub plan: crate::pg::conninfo::ConnectPlan,
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A certificate or key file could not be read or parsed.
    #[error("cannot read {what} {path}")]
    File {
        /// `sslrootcert`, `sslcert` or `sslkey`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// rustls refused the configuration (e.g. a key that does not match the certificate).
    #[error("invalid TLS configuration")]
    Rustls(#[source] rustls::Error),
    /// The thread that reads the files could not be started, or ended without an answer.
    #[error("cannot read the TLS files off the runtime's thread")]
    Thread(#[source] io::Error),
}

impl TlsError {
    /// The same error once more, for each connect that waited for one reading of the files
    /// (`io::Error` is not `Clone`: kind and text are kept).
    pub(crate) fn duplicate(&self) -> TlsError {
        let io = |e: &io::Error| io::Error::new(e.kind(), e.to_string());
        match self {
            TlsError::File { what, path, source } => TlsError::File {
                what,
                path: path.clone(),
                source: io(source),
            },
            TlsError::Rustls(err) => TlsError::Rustls(err.clone()),
            TlsError::Thread(err) => TlsError::Thread(io(err)),
        }
    }
}

/// The `sslrootcert` value that means the system's trusted roots, as in libpq 16 and later
/// (which then makes `verify-full` the default `sslmode` and refuses a weaker one).
pub const SYSTEM_ROOTS: &str = "system";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_pem_certs(
    what: &'static str,
    path: &PathBuf,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_err = |source: io::Error| TlsError::File {
        what,
        path: path.clone(),
        source,
    };
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(io::Error::other(e.to_string())))?
        .collect();
    let certs = certs.map_err(|e| file_err(io::Error::other(e.to_string())))?;
    if certs.is_empty() {
        return Err(file_err(io::Error::other("no PEM certificate in the file")));
    }
    Ok(certs)
}

impl TlsSettings {
    /// Whether any TLS is attempted.
    pub fn enabled(&self) -> bool {
        self.mode != SslMode::Disable
    }

    /// The tokio-postgres `sslmode` that goes with this setting (verification is ours).
    pub fn driver_mode(&self) -> tokio_postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }

    /// Whether [`TlsSettings::connector`] reads files: a root certificate (or the system's
    /// store, to verify the server) or a client certificate and key.
    pub fn reads_files(&self) -> bool {
        matches!(self.mode, SslMode::VerifyCa | SslMode::VerifyFull)
            || self.root_cert.is_some()
            || self.client_cert.is_some()
            || self.client_key.is_some()
    }

    /// Builds the connector.
    ///
    /// # Errors
    /// [`TlsError`] when a named file cannot be read or rustls refuses the configuration.
    pub fn connector(&self) -> Result<MakeRustlsConnect, TlsError> {
        let provider = provider();
        let verify = match (self.mode, &self.root_cert) {
            (SslMode::VerifyFull, _) => Verify::Full,
            // libpq verifies the chain whenever a root certificate is named, `prefer` and
            // `require` too (`prefer` then falls back to plaintext: `connecting`).
            (SslMode::VerifyCa, _) | (SslMode::Require | SslMode::Prefer, Some(_)) => Verify::Chain,
            _ => Verify::Nothing,
        };
        let verifier: Arc<dyn ServerCertVerifier> = match verify {
            Verify::Nothing => Arc::new(AcceptAny(provider.clone())),
            Verify::Chain | Verify::Full => {
                let trusted = match &self.root_cert {
                    Some(path) if path.as_os_str() != SYSTEM_ROOTS => {
                        read_pem_certs("sslrootcert", path)?
                    }
                    _ => rustls_native_certs::load_native_certs().certs,
                };
                let mut roots = RootCertStore::empty();
                if self.root_cert.is_some() {
                    for cert in &trusted {
                        roots.add(cert.clone()).map_err(TlsError::Rustls)?;
                    }
                } else {
                    // A system store holds certificates webpki cannot read; they are skipped.
                    roots.add_parsable_certificates(trusted.iter().cloned());
                }
                let chain =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
                Arc::new(AsLibpq {
                    chain,
                    trusted,
                    names: verify == Verify::Full,
                })
            }
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let chain = read_pem_certs("sslcert", cert)?;
                key_access_as_libpq(key)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
                    what: "sslkey",
                    path: key.clone(),
                    source: io::Error::other(e.to_string()),
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(TlsError::Rustls)?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(MakeRustlsConnect {
            config: Arc::new(config),
        })
    }
}

/// libpq's rule for the client's private key (`initialize_SSL`, PostgreSQL 14 and later): a
/// regular file, with no group or world access when it is the current user's, and at most
/// `u=rw,g=r` when it is root's. psql refuses a key anyone else may read, and so must the
/// session that is to lead with it ("mean what they mean to libpq").
fn key_access_as_libpq(key: &std::path::Path) -> Result<(), TlsError> {
    use std::os::unix::fs::MetadataExt;
    let refused = |why: String| TlsError::File {
        what: "sslkey",
        path: key.to_path_buf(),
        source: io::Error::new(io::ErrorKind::PermissionDenied, why),
    };
    let meta = std::fs::metadata(key).map_err(|source| TlsError::File {
        what: "sslkey",
        path: key.to_path_buf(),
        source,
    })?;
    if !meta.is_file() {
        return Err(refused(
            "the private key file is not a regular file".to_owned(),
        ));
    }
    let mode = meta.mode();
    let mine = meta.uid() == nix::unistd::geteuid().as_raw();
    if (mine && mode & 0o077 != 0) || (meta.uid() == 0 && mode & 0o037 != 0) {
        return Err(refused(format!(
            "the private key file has group or world access (mode {:04o}); file must have \
             permissions u=rw (0600) or less if owned by the current user, or permissions \
             u=rw,g=r (0640) or less if owned by root, as libpq requires",
            mode & 0o7777
        )));
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verify {
    Nothing,
    Chain,
    Full,
}

/// `sslmode=prefer|require` without a root: encrypt, trust any certificate (libpq's meaning).
/// Handshake signatures are still checked.
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca` and `verify-full` (and `require` with a root named), as libpq verifies:
/// the chain by webpki, or the certificate trusted as it stands when it is one of the roots;
/// with `names`, the host name by libpq's rules ([`peer`]).
#[derive(Debug)]
struct AsLibpq {
    chain: Arc<WebPkiServerVerifier>,
    /// The roots, as read: a server certificate equal to one of them is trusted as it stands.
    trusted: Vec<CertificateDer<'static>>,
    names: bool,
}

impl ServerCertVerifier for AsLibpq {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .chain
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            // webpki checks the chain first, then the name by its own rules: the chain is
            // sound, and the name is libpq's to judge.
            Ok(_)
            | Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => {}
            Err(refused) => match peer::trusted_as_is(end_entity, &self.trusted, now) {
                None => return Err(refused),
                Some(verdict) => verdict.map_err(rustls::Error::InvalidCertificate)?,
            },
        }
        if self.names {
            peer::PeerNames::of(end_entity)
                .and_then(|names| names.check(server_name))
                .map_err(rustls::Error::InvalidCertificate)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// tokio-postgres' TLS factory over rustls.
#[derive(Clone)]
pub struct MakeRustlsConnect {
    config: Arc<ClientConfig>,
}

impl<S> MakeTlsConnect<S> for MakeRustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, host: &str) -> Result<RustlsConnect, Self::Error> {
        // A Unix socket path in a list of hosts: the server answers the TLS request with "no"
        // there, so the name is never used.
        let host = if host.starts_with('/') {
            "localhost"
        } else {
            host
        };
        let name = ServerName::try_from(host.to_owned())?;
        Ok(RustlsConnect {
            name,
            connector: tokio_rustls::TlsConnector::from(self.config.clone()),
            progress: None,
        })
    }
}

/// One connection's TLS handshake.
pub struct RustlsConnect {
    name: ServerName<'static>,
    connector: tokio_rustls::TlsConnector,
    progress: Option<Arc<Handshake>>,
}

impl RustlsConnect {
    /// Records in `progress` whether the server agreed to TLS and whether the handshake then
    /// failed, so that a caller can tell a refusal over TLS from one in plaintext, and a
    /// failed handshake from a refusal (libpq's `sslmode=prefer` retry in plaintext follows
    /// both).
    pub fn noting(mut self, progress: Arc<Handshake>) -> Self {
        self.progress = Some(progress);
        self
    }
}

/// How far one connection's TLS got, as [`RustlsConnect::noting`] records it.
#[derive(Debug, Default)]
pub struct Handshake(std::sync::atomic::AtomicU8);

impl Handshake {
    const BEGAN: u8 = 1;
    const FAILED: u8 = 2;

    fn set(&self, state: u8) {
        self.0.store(state, std::sync::atomic::Ordering::Release);
    }

    /// Whether the server agreed to TLS (the handshake began, whatever came of it).
    pub fn began(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire) >= Self::BEGAN
    }

    /// Whether the handshake itself failed: the certificate was refused, or no protocol
    /// version or cipher was common.
    pub fn failed(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire) == Self::FAILED
    }
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            if let Some(progress) = &self.progress {
                progress.set(Handshake::BEGAN);
            }
            match self.connector.connect(self.name, stream).await {
                Ok(stream) => Ok(RustlsStream(Box::new(stream))),
                Err(err) => {
                    if let Some(progress) = &self.progress {
                        progress.set(Handshake::FAILED);
                    }
                    Err(err)
                }
            }
        })
    }
}

/// An encrypted stream. It offers `tls-server-end-point` channel binding (the module `peer`'s
/// `end_point_hash`), so `channel_binding=require` works as with libpq.
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let hash = self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(peer::end_point_hash);
        match hash {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}
