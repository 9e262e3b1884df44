//! Link simulator: WAN figures measured on one machine.
//!
//! Model (per direction, applied inside the client transport): a message of
//! `b` bytes starts transmitting when the link is free, occupies it for
//! `b·8 / bandwidth` seconds, and is delivered `one_way_latency` after its
//! last bit left. So pipelined messages share bandwidth (serialisation delays
//! add up) but not latency (they overlap), as on a real link. Upload delay is
//! applied before a request is written to the socket, download delay after a
//! response was read. `b` is the protobuf size of the message; TLS, HTTP/2 and
//! TCP overheads (a few %) are not modelled. The added delays come on top of
//! the real loopback's own cost; the last millisecond of each delay is
//! busy-waited for sub-millisecond accuracy.

use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ServiceError;

/// A simulated network link between client and server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkProfile {
    /// Added one-way latency (half the round-trip time).
    pub one_way_latency: Duration,
    /// Bandwidth cap in bits per second, both directions; `None` = unlimited.
    pub bandwidth_bps: Option<u64>,
}

impl LinkProfile {
    /// No added delay: the real loopback.
    pub const LOOPBACK: Self = Self {
        one_way_latency: Duration::ZERO,
        bandwidth_bps: None,
    };
    /// A local network: 0.5 ms RTT, 1 Gbit/s.
    pub const LAN: Self = Self {
        one_way_latency: Duration::from_micros(250),
        bandwidth_bps: Some(1_000_000_000),
    };
    /// A wide-area link: 80 ms RTT, 100 Mbit/s.
    pub const WAN80: Self = Self {
        one_way_latency: Duration::from_millis(40),
        bandwidth_bps: Some(100_000_000),
    };

    /// A link with round-trip time `rtt_ms` and bandwidth `mbps` (Mbit/s;
    /// 0 = unlimited), as given by `--rtt-ms/--mbps`.
    pub fn from_rtt_mbps(rtt_ms: f64, mbps: f64) -> Result<Self, ServiceError> {
        if !(rtt_ms.is_finite() && rtt_ms >= 0.0 && mbps.is_finite() && mbps >= 0.0) {
            return Err(ServiceError::Config {
                reason: format!("invalid link: rtt {rtt_ms} ms, {mbps} Mbit/s"),
            });
        }
        Ok(Self {
            one_way_latency: Duration::from_secs_f64(rtt_ms / 2e3),
            bandwidth_bps: (mbps > 0.0).then_some((mbps * 1e6) as u64),
        })
    }

    /// Whether this profile adds any delay.
    pub fn is_loopback(&self) -> bool {
        self.one_way_latency.is_zero() && self.bandwidth_bps.is_none()
    }

    /// Time to put `bytes` on the wire at the bandwidth cap.
    pub fn serialisation_delay(&self, bytes: usize) -> Duration {
        match self.bandwidth_bps {
            Some(bps) if bps > 0 => Duration::from_secs_f64(bytes as f64 * 8.0 / bps as f64),
            _ => Duration::ZERO,
        }
    }
}

impl FromStr for LinkProfile {
    type Err = ServiceError;

    /// `loopback`, `lan`, `wan80`, or `rtt=<ms>,mbps=<Mbit/s>`.
    fn from_str(s: &str) -> Result<Self, ServiceError> {
        match s {
            "loopback" => Ok(Self::LOOPBACK),
            "lan" => Ok(Self::LAN),
            "wan80" => Ok(Self::WAN80),
            _ => {
                let bad = || ServiceError::Config {
                    reason: format!("unknown link {s:?} (loopback, lan, wan80, rtt=MS,mbps=N)"),
                };
                let (mut rtt, mut mbps) = (None, None);
                for part in s.split(',') {
                    let (k, v) = part.split_once('=').ok_or_else(bad)?;
                    let v: f64 = v.trim().parse().map_err(|_| bad())?;
                    match k.trim() {
                        "rtt" => rtt = Some(v),
                        "mbps" => mbps = Some(v),
                        _ => return Err(bad()),
                    }
                }
                Self::from_rtt_mbps(rtt.ok_or_else(bad)?, mbps.unwrap_or(0.0))
            }
        }
    }
}

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

    /// Books a message of `bytes` entering the link now; returns when it is
    /// delivered at the other end.
    pub(crate) fn deliver_at(&self, bytes: usize) -> Instant {
        let now = Instant::now();
        let mut free = self.free_at.lock().unwrap_or_else(|p| p.into_inner());
        let start = free.map_or(now, |f| f.max(now));
        let done = start + self.profile.serialisation_delay(bytes);
        *free = Some(done);
        done + self.profile.one_way_latency
    }

    /// Waits until a message of `bytes` entering now has been delivered.
    ///
    /// Tokio timers tick in whole milliseconds, so the timer sleeps until
    /// about 1 ms before the deadline and the rest is spent yielding in a
    /// loop: sub-millisecond delays (`lan`) stay accurate at the cost of one
    /// busy core for up to 1 ms per message.
    pub(crate) async fn transit(&self, bytes: usize) {
        if self.profile.is_loopback() {
            return;
        }
        let deadline = self.deliver_at(bytes);
        let coarse = deadline.checked_sub(Duration::from_millis(1));
        if let Some(c) = coarse.filter(|c| *c > Instant::now()) {
            tokio::time::sleep_until(c).await;
        }
        while Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse() {
        assert_eq!("wan80".parse::<LinkProfile>().unwrap(), LinkProfile::WAN80);
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
}
