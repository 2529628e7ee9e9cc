//! Stand-in NICs for root tests: veth pairs with a full host configuration (MTU, MAC, alias,
//! altname, GSO/GRO sizes, an address, up), and an independent view of a device's state read
//! with `ip -j` (not with dranet's own netlink code).

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::kernel::{Veth, sh, unique};

/// A configured stand-in NIC: `veth.a` is the device under test, `veth.b` its peer (stays home).
pub struct Nic {
    pub veth: Veth,
    pub name: String,
    pub mac: String,
    pub addr: String,
}

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

impl Nic {
    /// Creates and configures one.
    pub fn create() -> Result<Self> {
        let veth = Veth::create(&unique("drn"), &unique("drq"))?;
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let mac = format!(
            "02:d7:{:02x}:{:02x}:{:02x}:{:02x}",
            (pid >> 8) & 0xff,
            pid & 0xff,
            (n >> 8) & 0xff,
            n & 0xff
        );
        let addr = format!(
            "10.{}.{}.{}/24",
            100 + (pid % 100),
            n % 250,
            1 + (pid / 100) % 250
        );
        let a = veth.a.clone();
        sh(&[
            "ip",
            "link",
            "set",
            &a,
            "mtu",
            "1400",
            "address",
            &mac,
            "alias",
            "dranet test nic",
        ])?;
        sh(&[
            "ip",
            "link",
            "set",
            &a,
            "gso_max_size",
            "32768",
            "gro_max_size",
            "32768",
        ])?;
        sh(&[
            "ip",
            "link",
            "property",
            "add",
            "dev",
            &a,
            "altname",
            &format!("{a}-alt"),
        ])?;
        sh(&["ip", "addr", "add", &addr, "dev", &a])?;
        sh(&["ip", "link", "set", &a, "up"])?;
        sh(&["ip", "link", "set", &veth.b, "up"])?;
        Ok(Self {
            name: a,
            veth,
            mac,
            addr,
        })
    }
}

impl Nic {
    /// A stand-in NIC and its host [`view`] before any test step touched it.
    pub fn with_view() -> Result<(Self, Value)> {
        let nic = Self::create()?;
        let before = view(&nic.name, None)?;
        Ok((nic, before))
    }

    /// `n` stand-in NICs and their host views.
    pub fn many_with_views(n: usize) -> Result<(Vec<Self>, Vec<Value>)> {
        let nics: Vec<Self> = (0..n).map(|_| Self::create()).collect::<Result<_>>()?;
        let before = nics.iter().map(|n| view(&n.name, None)).collect::<Result<_>>()?;
        Ok((nics, before))
    }
}

/// The fields of a device dranet promises to restore, read independently with `ip -j`.
pub fn view(name: &str, netns: Option<&str>) -> Result<Value> {
    let ns: Vec<&str> = netns.map(|n| vec!["-n", n]).unwrap_or_default();
    let mut link_args = vec!["ip"];
    link_args.extend(&ns);
    link_args.extend(["-j", "-d", "link", "show", "dev", name]);
    let link: Value = serde_json::from_str(&sh(&link_args)?).context("ip -j link")?;
    let mut addr_args = vec!["ip"];
    addr_args.extend(&ns);
    addr_args.extend(["-j", "addr", "show", "dev", name]);
    let addr: Value = serde_json::from_str(&sh(&addr_args)?).context("ip -j addr")?;
    let l = link.get(0).context("no such link")?;
    let mut addrs: Vec<String> = addr
        .get(0)
        .and_then(|a| a["addr_info"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|a| a["scope"] != "link")
        .map(|a| {
            // Everything a restore must put back as it was, not only ip/prefix: a broadcast
            // address (or none), the label.
            let mut s = format!("{}/{}", a["local"].as_str().unwrap_or(""), a["prefixlen"]);
            // DRANET_SIM_PLAIN_ADDRS=1: ip/prefix only (to run a test against a daemon that
            // restores addresses with a broadcast of its own, and see it fail for its own reason).
            if std::env::var_os("DRANET_SIM_PLAIN_ADDRS").is_some() {
                return s;
            }
            if let Some(b) = a["broadcast"].as_str() {
                s.push_str(&format!(" brd {b}"));
            }
            if let Some(l) = a["label"].as_str()
                && l != name
            {
                s.push_str(&format!(" label {l}"));
            }
            s
        })
        .collect();
    addrs.sort();
    let up = l["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "UP"));
    Ok(json!({
        "ifname": l["ifname"],
        "mtu": l["mtu"],
        "address": l["address"],
        "ifalias": l["ifalias"],
        "altnames": l["altnames"],
        "gso_max_size": l["gso_max_size"],
        "gro_max_size": l["gro_max_size"],
        "up": up,
        "addrs": addrs,
    }))
}

/// Fails with both views when they differ.
pub fn assert_same(before: &Value, after: &Value) -> Result<()> {
    if before != after {
        bail!("device state not restored:\n before: {before}\n after:  {after}");
    }
    Ok(())
}

/// Waits up to `timeout` until link `name` is in the host again and its [`view`] is the same as
/// `before` (restores finish right after the move home); the last difference otherwise.
pub async fn wait_restored(name: &str, before: &Value, timeout: std::time::Duration) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        let last = if crate::kernel::host_has(name) {
            view(name, None).and_then(|v| assert_same(before, &v))
        } else {
            Err(anyhow::anyhow!("{name} not in the host"))
        };
        match last {
            Ok(()) => return Ok(()),
            Err(e) if start.elapsed() > timeout => {
                return Err(e.context(format!("{name} not home and restored after {timeout:?}")));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}

/// The link state a tenant with NET_ADMIN can change that [`view`] leaves out, read with
/// `ip -j -d`: the settable flags (not UP or carrier ones), txqueuelen, group, the promiscuity
/// and allmulti counts, altnames.
pub fn link_state(name: &str, netns: Option<&str>) -> Result<Value> {
    let mut args = vec!["ip"];
    if let Some(n) = netns {
        args.extend(["-n", n]);
    }
    args.extend(["-j", "-d", "link", "show", "dev", name]);
    let v: Value = serde_json::from_str(&sh(&args)?).context("ip -j -d link")?;
    let l = v.get(0).context("no such link")?;
    let mut flags: Vec<String> = l["flags"]
        .as_array()
        .context("flags")?
        .iter()
        .filter_map(|f| f.as_str().map(str::to_owned))
        .filter(|f| !["UP", "LOWER_UP", "NO-CARRIER", "M-DOWN", "RUNNING"].contains(&f.as_str()))
        .collect();
    flags.sort();
    Ok(json!({
        "flags": flags,
        "txqlen": l["txqlen"],
        "group": l["group"],
        "promiscuity": l["promiscuity"],
        "allmulti": l["allmulti"],
        "altnames": l["altnames"],
    }))
}
