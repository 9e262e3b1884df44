//! Link simulator: per direction, a message occupies the link for `bytes·8 / bandwidth` and arrives
//! `one_way_latency` after its last bit (pipelined messages pay latency once).

use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ServiceError, TransportError};

/// A simulated network link between client and server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkProfile {
    /// Added one-way latency (half the round-trip time).
    pub one_way_latency: Duration,
    /// Bandwidth cap of the download (server → client) in bits per second; `None` = unlimited.
    pub bandwidth_bps: Option<u64>,
    /// Upload bandwidth cap (bits/s) when it differs from the download's.
    pub upload_bps: Option<u64>,
}

impl LinkProfile {
    /// No added delay: the real loopback.
    pub const LOOPBACK: Self = Self {
        one_way_latency: Duration::ZERO,
        bandwidth_bps: None,
        upload_bps: None,
    };
    /// A local network: 0.5 ms RTT, 1 Gbit/s.
    pub const LAN: Self = Self {
        one_way_latency: Duration::from_micros(250),
        bandwidth_bps: Some(1_000_000_000),
        upload_bps: None,
    };
    /// A nearby cloud region: 20 ms RTT, 100 Mbit/s both ways.
    pub const WAN20: Self = Self {
        one_way_latency: Duration::from_millis(10),
        bandwidth_bps: Some(100_000_000),
        upload_bps: None,
    };
    /// A wide-area link: 80 ms RTT, 100 Mbit/s both ways.
    pub const WAN80: Self = Self {
        one_way_latency: Duration::from_millis(40),
        bandwidth_bps: Some(100_000_000),
        upload_bps: None,
    };
    /// A home line to a distant region: 80 ms RTT, 20 Mbit/s up, 100 Mbit/s down.
    pub const HOME80: Self = Self {
        one_way_latency: Duration::from_millis(40),
        bandwidth_bps: Some(100_000_000),
        upload_bps: Some(20_000_000),
    };

    /// The named profiles, as `--link` takes them.
    pub const NAMED: [(&'static str, Self); 6] = [
        ("loopback", Self::LOOPBACK),
        ("lan", Self::LAN),
        ("wan20", Self::WAN20),
        ("wan80", Self::WAN80),
        ("home80", Self::HOME80),
        ("local", Self::LOOPBACK),
    ];

    /// Round-trip time added by the profile.
    #[must_use]
    pub fn rtt(&self) -> Duration {
        self.one_way_latency * 2
    }

    /// Upload bandwidth in bits per second (`None`: unlimited).
    #[must_use]
    pub fn up_bps(&self) -> Option<u64> {
        self.upload_bps.or(self.bandwidth_bps)
    }

    /// Download bandwidth in bits per second (`None`: unlimited).
    #[must_use]
    pub fn down_bps(&self) -> Option<u64> {
        self.bandwidth_bps
    }

    /// The upload direction alone: its bandwidth as the profile's only cap.
    #[must_use]
    pub fn upload(&self) -> Self {
        Self {
            one_way_latency: self.one_way_latency,
            bandwidth_bps: self.up_bps(),
            upload_bps: None,
        }
    }

    /// The download direction alone.
    #[must_use]
    pub fn download(&self) -> Self {
        Self {
            one_way_latency: self.one_way_latency,
            bandwidth_bps: self.down_bps(),
            upload_bps: None,
        }
    }

    /// A planning profile: the median TCP-handshake round trip to `endpoint`, 100 Mbit/s assumed.
    /// Errors: [`ServiceError::Config`], [`ServiceError::Transport`].
    pub fn measure_tcp(endpoint: &str) -> Result<Self, ServiceError> {
        let host_port = endpoint.split("://").last().unwrap_or(endpoint);
        let host_port = host_port.split('/').next().unwrap_or(host_port);
        let addr = std::net::ToSocketAddrs::to_socket_addrs(host_port)
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| ServiceError::Config {
                reason: format!("{host_port} does not resolve"),
            })?;
        let mut rtts = Vec::with_capacity(3);
        for _ in 0..3 {
            let t0 = std::time::Instant::now();
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(
                |source| ServiceError::Transport(TransportError::Connect { addr, source }),
            )?;
            rtts.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        rtts.sort_by(f64::total_cmp);
        Self::from_rtt_mbps(rtts[1], 100.0)
    }

    /// A link with round trip `rtt_ms` and `mbps` (0 = unlimited). Errors:
    /// [`ServiceError::Config`].
    pub fn from_rtt_mbps(rtt_ms: f64, mbps: f64) -> Result<Self, ServiceError> {
        Self::from_rtt_up_down(rtt_ms, mbps, mbps)
    }

    /// A link with round trip `rtt_ms` and separate up/down Mbit/s. Errors:
    /// [`ServiceError::Config`].
    pub fn from_rtt_up_down(
        rtt_ms: f64,
        up_mbps: f64,
        down_mbps: f64,
    ) -> Result<Self, ServiceError> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(rtt_ms) && ok(up_mbps) && ok(down_mbps)) {
            return Err(ServiceError::Config {
                reason: format!(
                    "invalid link: rtt {rtt_ms} ms, {up_mbps} Mbit/s up, {down_mbps} Mbit/s down"
                ),
            });
        }
        let bps = |m: f64| (m > 0.0).then_some((m * 1e6) as u64);
        Ok(Self {
            one_way_latency: Duration::from_secs_f64(rtt_ms / 2e3),
            bandwidth_bps: bps(down_mbps),
            upload_bps: (up_mbps != down_mbps).then_some(bps(up_mbps)).flatten(),
        })
    }

    /// Whether this profile adds any delay.
    pub fn is_loopback(&self) -> bool {
        self.one_way_latency.is_zero() && self.bandwidth_bps.is_none() && self.upload_bps.is_none()
    }

    /// Time to put `bytes` on the wire at the download bandwidth cap.
    pub fn serialisation_delay(&self, bytes: usize) -> Duration {
        match self.bandwidth_bps {
            Some(bps) if bps > 0 => Duration::from_secs_f64(bytes as f64 * 8.0 / bps as f64),
            _ => Duration::ZERO,
        }
    }
}

impl FromStr for LinkProfile {
    type Err = ServiceError;

    /// `loopback`, `lan`, `wan20`, `wan80`, `home80`, or `rtt=<ms>[,mbps=…][,up=…][,down=…]`.
    fn from_str(s: &str) -> Result<Self, ServiceError> {
        if let Some((_, p)) = Self::NAMED.iter().find(|(n, _)| *n == s) {
            return Ok(*p);
        }
        let bad = || ServiceError::Config {
            reason: format!(
                "unknown link {s:?} (loopback, lan, wan20, wan80, home80, rtt=MS[,mbps=N][,up=N][,down=N])"
            ),
        };
        let (mut rtt, mut mbps, mut up, mut down) = (None, None, None, None);
        for part in s.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(bad)?;
            let v: f64 = v.trim().parse().map_err(|_| bad())?;
            match k.trim() {
                "rtt" => rtt = Some(v),
                "mbps" => mbps = Some(v),
                "up" => up = Some(v),
                "down" => down = Some(v),
                _ => return Err(bad()),
            }
        }
        let both = mbps.unwrap_or(0.0);
        Self::from_rtt_up_down(
            rtt.ok_or_else(bad)?,
            up.unwrap_or(both),
            down.unwrap_or(both),
        )
    }
}

/// How close to a delivery time the link stops relying on tokio's millisecond timer.
const FINE_WAIT: Duration = Duration::from_millis(2);

/// One direction of a simulated link: when it is next free.
#[derive(Debug)]
pub(crate) struct LinkDirection {
    profile: LinkProfile,
    free_at: Mutex<Option<Instant>>,
}

impl LinkDirection {
    pub(crate) fn new(profile: LinkProfile) -> Self {
        Self {
            profile,
            free_at: Mutex::new(None),
        }
    }

    /// Books a message of `bytes` entering the link now; returns its delivery time.
    pub(crate) fn deliver_at(&self, bytes: usize) -> Instant {
        let now = Instant::now();
        let mut free = self.free_at.lock().unwrap_or_else(|p| p.into_inner());
        let start = free.map_or(now, |f| f.max(now));
        let done = start + self.profile.serialisation_delay(bytes);
        *free = Some(done);
        done + self.profile.one_way_latency
    }

    /// Whether this direction adds no delay.
    pub(crate) fn is_loopback(&self) -> bool {
        self.profile.is_loopback()
    }

    /// Waits until `deadline` without spending CPU: tokio's timer wakes on whole milliseconds
    /// (up to 1 ms late), so it sleeps to within [`FINE_WAIT`] of the deadline and a blocking
    /// thread's OS sleep (tens of microseconds late) covers the rest. A busy wait here would take
    /// the core from the client's own forward, which shares it in the benchmarks.
    pub(crate) async fn wait_until(deadline: Instant) {
        let coarse = deadline.checked_sub(FINE_WAIT);
        if let Some(c) = coarse.filter(|c| *c > Instant::now()) {
            tokio::time::sleep_until(c).await;
        }
        let rest = deadline.saturating_duration_since(Instant::now());
        if !rest.is_zero() {
            // A failed join only means the runtime is shutting down: nothing is left to deliver to.
            let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
        }
    }

    /// Waits until a message of `bytes` entering now is delivered.
    pub(crate) async fn transit(&self, bytes: usize) {
        if self.profile.is_loopback() {
            return;
        }
        Self::wait_until(self.deliver_at(bytes)).await;
    }
}

/// Forwards each booked message at its delivery time, in order.
pub(crate) async fn deliver_in_order<T>(
    mut booked: tokio::sync::mpsc::Receiver<(Option<Instant>, T)>,
    out: tokio::sync::mpsc::Sender<T>,
) {
    while let Some((at, item)) = booked.recv().await {
        if let Some(at) = at {
            LinkDirection::wait_until(at).await;
        }
        if out.send(item).await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse() {
        assert_eq!("wan80".parse::<LinkProfile>().unwrap(), LinkProfile::WAN80);
        assert_eq!(
            "wan20".parse::<LinkProfile>().unwrap().rtt(),
            Duration::from_millis(20)
        );
        let home: LinkProfile = "home80".parse().unwrap();
        assert_eq!(home.up_bps(), Some(20_000_000));
        assert_eq!(home.down_bps(), Some(100_000_000));
        let custom: LinkProfile = "rtt=80,up=20,down=100".parse().unwrap();
        assert_eq!(custom, home);
        assert!(!home.is_loopback());
        let p: LinkProfile = "rtt=20,mbps=50".parse().unwrap();
        assert_eq!(p.one_way_latency, Duration::from_millis(10));
        assert_eq!(p.bandwidth_bps, Some(50_000_000));
        assert!("rtt=-1".parse::<LinkProfile>().is_err());
        assert!("moon".parse::<LinkProfile>().is_err());
    }

    // Tokio's clock is paused: `Instant::now()` does not move between calls.
    #[tokio::test(start_paused = true)]
    async fn pipelined_messages_share_bandwidth_but_overlap_latency() {
        let p = LinkProfile {
            one_way_latency: Duration::from_millis(40),
            bandwidth_bps: Some(8_000_000), // 1 MB/s
            upload_bps: None,
        };
        assert_eq!(p.serialisation_delay(1000), Duration::from_millis(1));
        let d = LinkDirection::new(p);
        let t0 = Instant::now();
        let a = d.deliver_at(10_000); // 10 ms on the wire
        let b = d.deliver_at(10_000);
        // a: 10 ms on the wire + 40 ms latency; b leaves when a has left.
        assert_eq!(a - t0, Duration::from_millis(50));
        // b is delayed by a's serialisation only, not by a's latency.
        assert_eq!(b - t0, Duration::from_millis(60));
    }

    #[test]
    fn home80_is_asymmetric() {
        let p = LinkProfile::HOME80;
        assert_eq!(
            p.upload().serialisation_delay(2_500_000),
            Duration::from_secs(1)
        );
        assert_eq!(
            p.download().serialisation_delay(12_500_000),
            Duration::from_secs(1)
        );
    }
}
