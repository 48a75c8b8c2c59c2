//! The streaming part of the benchmark, through one client for every runtime (crius's own
//! SPDY client, the protocol kubelet proxies): `exec true` over the streaming path (Exec, the
//! upgrade, the exit status), and port forwarding to busybox httpd in a pod (by the release
//! binary's `crius port-forward`): the throughput of one large download and the time of a small
//! request on a new connection.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crius::cri::v1 as cri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Results, Rt};

/// A pod serving `/big` (`mb` MiB) and `/small` with httpd on port 8080; its sandbox ID.
async fn web_pod(rt: &mut Rt, image: &str, mb: usize) -> Result<(String, String)> {
    let (pod, sb) = rt.run_pod().await?;
    let script = format!(
        "mkdir -p /www && echo small > /www/small && head -c {} /dev/zero > /www/big.tmp && \
         mv /www/big.tmp /www/big && exec httpd -f -p 8080 -h /www",
        mb << 20
    );
    let ctr = rt
        .start_container_cmd(&pod, &sb, image, &["sh", "-c", &script])
        .await?;
    let start = Instant::now();
    loop {
        let r = rt
            .rt
            .exec_sync(cri::ExecSyncRequest {
                container_id: ctr.clone(),
                cmd: vec!["test".into(), "-f".into(), "/www/big".into()],
                timeout: 10,
            })
            .await?
            .into_inner();
        if r.exit_code == 0 {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("{}: the web pod never wrote its file", rt.name());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((pod, ctr))
}

/// GET `path` through 127.0.0.1:`port`: the body's length.
async fn get(port: u16, path: &str) -> Result<usize> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n;
    }
    Ok(total)
}

pub async fn rows(
    rt: &mut Rt,
    client: &std::path::Path,
    image: &str,
    mb: usize,
    res: &mut Results,
) -> Result<()> {
    let name = rt.name();
    let (pod, ctr) = web_pod(rt, image, mb).await?;
    // exec true, the whole streaming path.
    for _ in 0..5 {
        let (code, ms) = super::timed(async {
            let url = rt
                .rt
                .exec(cri::ExecRequest {
                    container_id: ctr.clone(),
                    cmd: vec!["true".into()],
                    stdout: true,
                    stderr: true,
                    ..Default::default()
                })
                .await?
                .into_inner()
                .url;
            Ok(crius::cli::stream::remote_command(&url, false, false).await?)
        })
        .await?;
        if code != 0 {
            bail!("{name}: streamed exec true exited {code}");
        }
        res.add("streaming exec true (Exec+upgrade+exit)", "ms", name, ms);
    }
    // Port forwarding.
    let local = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    // The client is the release binary's `crius port-forward`, the same for every runtime (it
    // speaks CRI to whichever socket it is given): the library linked into xtask is built
    // without optimisation, and as the client it held every runtime to its own speed.
    let mut forwarder = Forwarder(
        std::process::Command::new(client)
            .arg("--socket")
            .arg(&rt.peer.socket)
            .args(["port-forward", &pod, &format!("{local}:8080")])
            .stdout(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("{}: starting the port forwarder", client.display()))?,
    );
    let start = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .is_err()
    {
        if let Some(status) = forwarder.0.try_wait()? {
            bail!("{name}: the port forwarder ended ({status}) before listening");
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("{name}: the port forwarder never listened");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..3 {
        let t = Instant::now();
        let n = get(local, "/big").await?;
        let secs = t.elapsed().as_secs_f64();
        if n < mb << 20 {
            bail!("{name}: port-forward brought {n} bytes of {}", mb << 20);
        }
        res.add(
            &format!("port-forward download {mb} MiB (MB/s)"),
            "MB/s",
            name,
            n as f64 / 1e6 / secs,
        );
    }
    for _ in 0..10 {
        let (n, ms) = super::timed(get(local, "/small")).await?;
        if n == 0 {
            bail!("{name}: nothing came back through port-forward");
        }
        res.add("port-forward new connection + small GET", "ms", name, ms);
    }
    drop(forwarder);
    rt.remove_pod(&pod).await
}

/// The forwarding process, ended with the rows.
struct Forwarder(std::process::Child);

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
