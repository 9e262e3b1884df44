//! `cipherlora dev-cert`: a throw-away CA and a localhost server certificate.

use std::path::PathBuf;

use clap::Args;

/// Arguments of `cipherlora dev-cert`.
#[derive(Debug, Args)]
pub struct DevCertArgs {
    /// Folder for `ca.pem` (give to clients), `cert.pem` and `key.pem`
    /// (`serve --tls-cert/--tls-key`; the key is written with mode 0600).
    #[arg(long)]
    out: PathBuf,
    /// Names the certificate is valid for (DNS names or IP addresses).
    #[arg(long = "name", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string()])]
    names: Vec<String>,
}

impl DevCertArgs {
    /// Writes the development PKI and prints the paths. For development and
    /// tests only: the CA key is discarded, so nothing else can be signed.
    pub fn run(self) -> anyhow::Result<()> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let p = cipherlora_service::write_dev_cert(&self.out, &names)?;
        println!("ca:   {}", p.ca.display());
        println!("cert: {}", p.cert.display());
        println!("key:  {}", p.key.display());
        Ok(())
    }
}
