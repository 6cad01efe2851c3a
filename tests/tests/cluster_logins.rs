//! Every way a client logs in to the secured cluster (deploy/local/cluster.sh)
//! is the same Kafka user, `User:<service>`, with the same ACLs: a TLS
//! client certificate on the mTLS listener, SASL/PLAIN, SASL/OAUTHBEARER with
//! a token of the cluster's OIDC issuer, and SCRAM-SHA-512. Each login runs
//! a service's fixture end to end, inputs and output compressed with a codec
//! of its own, checked batch by batch in the brokers' logs. A wrong
//! credential of each kind stops the service within a minute with one error
//! that names the cause. Every log is searched for the cluster's secrets.
//!
//! Its own test binary: the cluster starts once (a no-op when it runs), and
//! no test here stops a broker.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use e2e_tests::cluster::{self, assert_no_password, AsUser, Login};
use e2e_tests::*;

/// Runs a fixture as its service's user with `login`, inputs and output
/// compressed with `codec`; checks the codecs and that nothing leaks.
fn fixture_logged_in(login: Login, codec: &'static str, run: fn(&AsUser) -> Service) -> Service {
    cluster::use_cluster();
    let started = Instant::now();
    let launcher = AsUser::new(login, codec);
    let service = run(&launcher);
    launcher.assert_compressed();
    assert_no_password(&service.log(), "the service log");
    for path in ["/metrics", "/healthz", "/readyz"] {
        let answer = http_get(service.http_port, path).unwrap_or_default();
        assert_no_password(&answer, path);
    }
    eprintln!("{login:?} with {codec}: {:?}", started.elapsed());
    service
}

#[test]
fn window_aggregator_over_mtls_with_gzip() {
    fixture_logged_in(Login::Mtls, "gzip", fixture_runs::window_aggregator_on);
}

#[test]
fn sensor_fusion_over_sasl_plain_with_snappy() {
    fixture_logged_in(Login::Plain, "snappy", fixture_runs::sensor_fusion_on);
}

#[test]
fn order_shipment_joiner_over_oidc_with_zstd() {
    let service = fixture_logged_in(Login::Oidc, "zstd", fixture_runs::order_shipment_joiner_on);
    // The tokens came from the issuer, for the service's own client id.
    let issued = "token for order-shipment-joiner (scope kafka";
    assert!(
        issuer_log().contains(issued),
        "the issuer issued no token to order-shipment-joiner:\n{}\n{}",
        issuer_log(),
        service.log()
    );
}

#[test]
fn embed_batcher_over_scram_with_lz4() {
    fixture_logged_in(Login::Scram, "lz4", fixture_runs::embed_batcher_on);
}

fn issuer_log() -> String {
    std::fs::read_to_string(cluster::home().join("logs/issuer.log")).unwrap_or_default()
}

/// The sessionizer's properties file for `login` with each `(key, value)`
/// of `changes` in place of the key's line.
fn properties_with(login: Login, changes: &[(&str, &str)]) -> PathBuf {
    cluster::use_cluster();
    let original = std::fs::read_to_string(cluster::properties_for("sessionizer", login)).unwrap();
    let mut text: String = original
        .lines()
        .filter(|line| {
            !changes
                .iter()
                .any(|(key, _)| line.starts_with(&format!("{key}=")))
        })
        .map(|line| format!("{line}\n"))
        .collect();
    for (key, value) in changes {
        text.push_str(&format!("{key}={value}\n"));
    }
    let path = scratch_dir().join(format!("{}.properties", unique("client")));
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts the sessionizer as its user with `login` but with `properties`
/// for its properties file, over a fresh input; expects it to exit with an
/// error within a minute and returns the error: the one `error:` line of
/// its log.
fn sessionizer_fails(login: Login, properties: &Path) -> String {
    cluster::use_cluster();
    let input = unique("user-events");
    create_topic(&input, 1);
    let mut arguments = args(&[
        "--input-topic",
        &input,
        "--output-topic",
        &unique("user-sessions"),
        "--application-id",
        &unique("sessionizer"),
    ]);
    let mut flags = cluster::flags_for("sessionizer", login);
    let at = flags
        .iter()
        .position(|f| f == "--kafka-config-file")
        .unwrap();
    flags[at + 1] = properties.to_str().unwrap().to_string();
    arguments.extend(flags);
    let started = Instant::now();
    let service = Service::start("sessionizer", &arguments);
    eprint!("{login:?}: ");
    let log = cluster::expect_failure(service, started);
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{log}");
    errors[0].to_string()
}

#[test]
fn an_expired_client_certificate_is_a_tls_error() {
    cluster::use_cluster();
    let dir = scratch_dir().join(unique("expired"));
    std::fs::create_dir_all(dir.join("db")).unwrap();
    std::fs::write(dir.join("db/index.txt"), "").unwrap();
    std::fs::write(dir.join("db/serial"), "01\n").unwrap();
    // openssl 3.0's x509 cannot date a certificate back; `openssl ca` can.
    std::fs::write(
        dir.join("ca.cnf"),
        "[ca]\ndefault_ca = local\n\
         [local]\ndatabase = db/index.txt\nnew_certs_dir = db\nserial = db/serial\n\
         default_md = sha256\npolicy = any\nunique_subject = no\n\
         [any]\ncommonName = supplied\n\
         [client]\nextendedKeyUsage = clientAuth\n",
    )
    .unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run openssl");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let tls = cluster::home().join("tls");
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        "key.pem",
    ]);
    openssl(&[
        "req",
        "-new",
        "-key",
        "key.pem",
        "-subj",
        "/CN=sessionizer",
        "-out",
        "req.csr",
    ]);
    openssl(&[
        "ca",
        "-batch",
        "-config",
        "ca.cnf",
        "-extensions",
        "client",
        "-notext",
        "-cert",
        tls.join("ca.pem").to_str().unwrap(),
        "-keyfile",
        tls.join("ca.key").to_str().unwrap(),
        "-startdate",
        "20200101000000Z",
        "-enddate",
        "20200102000000Z",
        "-in",
        "req.csr",
        "-out",
        "cert.pem",
    ]);
    let properties = properties_with(
        Login::Mtls,
        &[
            (
                "ssl.certificate.location",
                dir.join("cert.pem").to_str().unwrap(),
            ),
            ("ssl.key.location", dir.join("key.pem").to_str().unwrap()),
        ],
    );
    let error = sessionizer_fails(Login::Mtls, &properties);
    // The broker's TLS 1.3 alert is `certificate unknown` whatever the
    // reason; the runtime names the certificate and what to check.
    let named = format!(
        "the brokers refused the client certificate {}: is it expired",
        dir.join("cert.pem").display()
    );
    assert!(error.contains(&named), "{error}");
}

#[test]
fn a_wrong_oidc_client_secret_is_a_token_error() {
    let properties = properties_with(
        Login::Oidc,
        &[("sasl.oauthbearer.client.secret", "not-the-secret")],
    );
    let error = sessionizer_fails(Login::Oidc, &properties);
    let endpoint = "no OAUTHBEARER token from the token endpoint https://127.0.0.1:18443/token";
    assert!(error.contains(endpoint), "{error}");
    assert!(error.contains("invalid_client"), "{error}");
    assert!(
        issuer_log().contains("401 client sessionizer: wrong secret"),
        "{}",
        issuer_log()
    );
}

#[test]
fn a_wrong_plain_password_is_an_authentication_error() {
    let properties = properties_with(Login::Plain, &[("sasl.password", "not-the-password")]);
    let error = sessionizer_fails(Login::Plain, &properties);
    assert!(error.contains("SASL authentication error"), "{error}");
    assert!(error.contains("Invalid username or password"), "{error}");
}
