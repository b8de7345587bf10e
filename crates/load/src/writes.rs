//! `socket-writes`: what one write of a page to a subscriber's socket costs on this
//! machine, with no server at all: 1,000 loopback TCP connections, a page of ~2 KB (the
//! size of the service's page of 10 `custom.tick` frames in `fanout`) written to each of
//! them 100 times a second from one thread, every byte read back by a second thread.
//! The writer's CPU per write (user and kernel; the kernel's loopback delivery to the
//! reader runs in the writer) is measured two ways: one buffer holding the whole HTTP/1.1
//! chunk (what `fanout`'s floor writes), and `writev` of the chunk's three parts (size
//! line, frames, CRLF: what hyper writes for the service). Each also with 4 KiB and
//! 16 KiB of state per connection touched before its write, as a server's per-subscriber
//! state is (its task, its connection's and its body's state): the state's own touching,
//! measured alone, is subtracted. The baseline is the bare write of one buffer, in the
//! same run; the rounds are interleaved.
//!
//! It answers a question `fanout` cannot: how much of a write's cost is the kernel's on
//! this host, and how much more the same write costs when each subscriber's state has to
//! be brought back into the cache first (log, 2026-12-08).

use std::io::{IoSlice, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::support;

/// Connections written to, as `fanout`'s 1,000 subscribers.
const SOCKETS: usize = 1_000;
/// Bytes of frames in a page (the service's page of 10 ticks is ~2,010).
const PAGE: usize = 2_000;
/// Pages per measurement, one every [`EVERY`], as `fanout`'s producer.
const PAGES: usize = 100;
const EVERY: Duration = Duration::from_millis(10);
/// Interleaved rounds after a first one that is not counted (the sockets' buffers and
/// the reader settle in it); the table gives each mode's median.
const ROUNDS: usize = 5;

/// How a page goes to a socket.
#[derive(Clone, Copy, PartialEq)]
enum How {
    /// The whole chunk in one buffer, one `write`.
    One,
    /// Size line, frames and CRLF as three slices, one `writev`.
    Three,
    /// No write: only the state is touched (what is subtracted).
    Touch,
}

/// Runs the scenario and prints its table.
pub fn run() {
    support::raise_open_files();
    let (mut writers, reader) = connect();
    let frames: Vec<u8> = (0..PAGE).map(|i| if i % 200 == 199 { b'\n' } else { b'x' }).collect();
    let size_line = format!("{PAGE:x}\r\n").into_bytes();
    let one = [&size_line[..], &frames, b"\r\n"].concat();
    let modes: Vec<(How, usize)> = [0, 4 << 10, 16 << 10]
        .into_iter()
        .flat_map(|state| {
            let touch = (state > 0).then_some((How::Touch, state));
            [(How::One, state), (How::Three, state)].into_iter().chain(touch)
        })
        .collect();
    let mut states: Vec<Vec<u8>> = vec![vec![1; 16 << 10]; SOCKETS];
    let mut cpu: Vec<Vec<f64>> = vec![vec![]; modes.len()];
    for round in 0..=ROUNDS {
        for (m, &(how, state)) in modes.iter().enumerate() {
            let before = thread_cpu();
            let mut next = Instant::now();
            for _ in 0..PAGES {
                for (w, s) in writers.iter_mut().zip(&mut states) {
                    touch(&mut s[..state]);
                    let written = match how {
                        How::One => w.write_all(&one),
                        How::Three => write_all_vectored(w, &size_line, &frames),
                        How::Touch => Ok(()),
                    };
                    written.expect("a loopback write");
                }
                next += EVERY;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            if round > 0 {
                cpu[m].push((thread_cpu() - before).as_secs_f64() * 1e6 / (PAGES * SOCKETS) as f64);
            }
        }
    }
    drop(writers);
    let read = reader.join().expect("the reader thread");
    let writing = modes.iter().filter(|(how, _)| *how != How::Touch).count();
    let expected = ((ROUNDS + 1) * writing * PAGES * SOCKETS * one.len()) as u64;
    println!(
        "{SOCKETS} loopback connections, a {}-byte chunk to each {} times a second; {ROUNDS} interleaved rounds of {PAGES} pages; bytes read back {read} of {expected}",
        one.len(),
        Duration::from_secs(1).as_millis() / EVERY.as_millis()
    );
    println!("| write | state touched per connection | writer's CPU per write (µs), median (min–max) | less the state alone | vs one buffer, no state |");
    println!("|---|---|---|---|---|");
    let medians: Vec<f64> = cpu.iter().map(|v| support::pct(&mut v.clone(), 0.5)).collect();
    let touch_of =
        |state: usize| modes.iter().position(|&m| m == (How::Touch, state)).map_or(0.0, |i| medians[i]);
    let base = medians[0];
    for (m, &(how, state)) in modes.iter().enumerate() {
        let v = &cpu[m];
        let (lo, hi) = (v.iter().copied().fold(f64::MAX, f64::min), v.iter().copied().fold(0.0, f64::max));
        let name = match how {
            How::One => "one buffer (`write`)",
            How::Three => "size line, frames, CRLF (`writev`)",
            How::Touch => "none (the state alone)",
        };
        let (net, ratio) = match how {
            How::Touch => ("-".to_owned(), "-".to_owned()),
            _ => {
                let net = medians[m] - touch_of(state);
                (format!("{net:.2}"), format!("{:.2}", net / base))
            }
        };
        println!("| {name} | {} KiB | {:.2} ({lo:.2}–{hi:.2}) | {net} | {ratio} |", state >> 10, medians[m]);
    }
    if read != expected {
        println!("not every byte came back: the figures above are not comparable");
    }
}

/// `SOCKETS` connected pairs: the writing ends (blocking, `TCP_NODELAY` as the service
/// sets), and a thread that reads every reading end to its end and returns the bytes read.
fn connect() -> (Vec<TcpStream>, std::thread::JoinHandle<u64>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let addr = listener.local_addr().expect("its address");
    let mut writers = Vec::with_capacity(SOCKETS);
    let mut readers = Vec::with_capacity(SOCKETS);
    for _ in 0..SOCKETS {
        let r = TcpStream::connect(addr).expect("connect");
        let (w, _) = listener.accept().expect("accept");
        w.set_nodelay(true).expect("TCP_NODELAY");
        r.set_nonblocking(true).expect("non-blocking");
        writers.push(w);
        readers.push(r);
    }
    // The readers on a runtime of their own thread, as the load tool's subscribers: a
    // socket is read when the kernel says it is readable, into one buffer per task.
    let reader = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().expect("a runtime");
        rt.block_on(async move {
            let tasks: Vec<_> = readers
                .into_iter()
                .map(|r| {
                    tokio::spawn(async move {
                        use tokio::io::AsyncReadExt;
                        let mut r = tokio::net::TcpStream::from_std(r).expect("a tokio stream");
                        let (mut buf, mut n) = (vec![0; 16 << 10], 0u64);
                        while let Ok(k @ 1..) = r.read(&mut buf).await {
                            n += k as u64;
                        }
                        n
                    })
                })
                .collect();
            let mut total = 0;
            for t in tasks {
                total += t.await.unwrap_or(0);
            }
            total
        })
    });
    (writers, reader)
}

/// Reads and writes one byte of each cache line of `state`, as a task's poll brings its
/// state back into the cache.
fn touch(state: &mut [u8]) {
    let mut x = 0u8;
    for b in state.iter_mut().step_by(64) {
        x = x.wrapping_add(*b);
        *b = x;
    }
    std::hint::black_box(x);
}

/// Writes the chunk as three slices, as hyper queues a chunk: its size line, its
/// frames, its CRLF (one `writev` unless the socket takes less). By hand because std's
/// `Write::write_all_vectored` is not stable.
fn write_all_vectored(w: &mut TcpStream, size_line: &[u8], frames: &[u8]) -> std::io::Result<()> {
    let crlf = b"\r\n";
    let mut parts = [IoSlice::new(size_line), IoSlice::new(frames), IoSlice::new(crlf)];
    let mut parts = &mut parts[..];
    while !parts.is_empty() {
        let n = w.write_vectored(parts)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut parts, n);
    }
    Ok(())
}

/// This thread's CPU time so far, user and kernel (`getrusage(RUSAGE_THREAD)`).
fn thread_cpu() -> Duration {
    let usage =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1_000);
    tv(usage.user_time()) + tv(usage.system_time())
}
