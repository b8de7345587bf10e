//! The README's examples, run: every command block of "Try it" (with bash and curl,
//! against a fresh service) and the administration example (the binary, against a
//! fresh schema), each shown output compared with what came out, ids, keys and times
//! masked. Where the README shortens an output (`...`), the parts it shows must appear
//! in order.

use crate::common::TestApp;

const README: &str = include_str!("../../README.md");

/// One indented block of a section, and the paragraph line just before it.
struct Block {
    intro: String,
    text: String,
}

fn blocks(section: &str) -> Vec<Block> {
    let start = README.find(&format!("\n## {section}\n")).expect("section") + 1;
    let body = &README[start..];
    let end = body[3..].find("\n## ").map_or(body.len(), |i| i + 3);
    let mut out = vec![];
    let (mut intro, mut text, mut in_block) = (String::new(), String::new(), false);
    for line in body[..end].lines() {
        if let Some(code) = line.strip_prefix("    ") {
            in_block = true;
            text.push_str(code);
            text.push('\n');
        } else if in_block && line.trim().is_empty() {
            text.push('\n');
        } else {
            if in_block {
                out.push(Block {
                    intro: intro.clone(),
                    text: std::mem::take(&mut text).trim_end().to_owned(),
                });
                in_block = false;
            }
            if !line.trim().is_empty() {
                intro = line.to_owned();
            }
        }
    }
    if in_block {
        out.push(Block { intro, text: text.trim_end().to_owned() });
    }
    out
}

/// Ids, keys and times replaced by placeholders; whitespace removed (pretty-printed
/// and compact JSON compare equal).
fn mask(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(chars.len());
    let mut i = 0;
    while i < chars.len() {
        if let Some(n) = timestamp(&chars[i..]) {
            out.push_str("TS");
            i += n;
            continue;
        }
        if word(chars[i]) && (i == 0 || !word(chars[i - 1])) {
            let n = chars[i..].iter().take_while(|c| word(**c)).count();
            let w: String = chars[i..i + n].iter().collect();
            let crockford = |c: char| c.is_ascii_digit() || (c.is_ascii_uppercase() && !"ILOU".contains(c));
            let hex = |t: &str| t.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
            let masked = match w.split('_').collect::<Vec<_>>().as_slice() {
                ["ask", id, secret] if id.len() == 12 && secret.len() == 48 => Some("KEY"),
                _ if w.len() == 12 && hex(&w) => Some("KEYID"),
                _ if w.len() == 26 && w.chars().all(crockford) => Some("ULID"),
                _ => None,
            };
            match masked {
                Some(m) => out.push_str(m),
                None => out.push_str(&w),
            }
            i += n;
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out.split_whitespace().collect()
}

/// The length of an RFC 3339 time at the start of `c` (`2026-11-22T20:17:00.608381Z`).
fn timestamp(c: &[char]) -> Option<usize> {
    let shape = "dddd-dd-ddTdd:dd:dd";
    if c.len() < shape.len() {
        return None;
    }
    for (s, x) in shape.chars().zip(c) {
        let ok = if s == 'd' { x.is_ascii_digit() } else { s == *x };
        if !ok {
            return None;
        }
    }
    let mut n = shape.len();
    if c.get(n) == Some(&'.') {
        n += 1;
        n += c[n..].iter().take_while(|x| x.is_ascii_digit()).count();
    }
    match c.get(n) {
        Some('Z') => Some(n + 1),
        Some('+' | '-') => Some(n + 6),
        _ => Some(n),
    }
}

/// The shown output matches the actual one: equal after masking, or, where the README
/// shortens it with `...`, every shown part found in order.
fn matches(shown: &str, actual: &str) -> Result<(), String> {
    let (shown_m, actual_m) = (mask(shown), mask(actual));
    if !shown.contains("...") {
        return if shown_m == actual_m {
            Ok(())
        } else {
            Err(format!("expected\n{shown_m}\ngot\n{actual_m}"))
        };
    }
    let mut at = 0;
    for part in shown_m.split("...").filter(|p| !p.is_empty()) {
        match actual_m[at..].find(part) {
            Some(i) => at += i + part.len(),
            None => return Err(format!("`{part}` not found (in order) in\n{actual_m}")),
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_try_it_examples_run_as_shown() {
    let t = TestApp::new().await;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(&t.db.schema);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let tmp = dir.to_str().expect("path");
    let host = t.base.trim_start_matches("http://");
    // The commands, in order, each followed by a marker; the key is the test tenant's.
    let all = blocks("Try it");
    let mut script = format!("KEY={}\n", t.key_a);
    let mut expected = vec![];
    let mut pending_command = false;
    for (i, b) in all.iter().enumerate() {
        if i == 0 {
            assert!(b.text.contains("dev-key"), "the first block reads the dev key");
            continue;
        }
        if b.intro.starts_with("Output") {
            assert!(pending_command, "an output follows a command: {}", b.intro);
            expected.push((b.intro.clone(), b.text.clone()));
            pending_command = false;
            continue;
        }
        if pending_command {
            // A command whose output the README does not show.
            expected.push((String::new(), String::new()));
        }
        let cmd = b.text.replace("localhost:8080", host).replace("/tmp/", &format!("{tmp}/"));
        script.push_str(&cmd);
        script.push_str(&format!("\necho '@@@ {}'\n", expected.len()));
        pending_command = true;
    }
    if pending_command {
        expected.push((String::new(), String::new()));
    }
    assert!(expected.len() >= 10, "{} command blocks", expected.len());
    let out = tokio::process::Command::new("bash").args(["-c", &script]).output().await.expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let mut outputs = vec![];
    let mut rest: &str = &stdout;
    for n in 0..expected.len() {
        let marker = format!("@@@ {n}\n");
        let at = rest.find(&marker).unwrap_or_else(|| panic!("block {n} did not finish:\n{stdout}"));
        outputs.push(rest[..at].to_owned());
        rest = &rest[at + marker.len()..];
    }
    let mut failures = vec![];
    let mut compared = 0;
    for (n, ((intro, shown), actual)) in expected.iter().zip(&outputs).enumerate() {
        if shown.is_empty() {
            continue;
        }
        compared += 1;
        if let Err(e) = matches(shown, actual) {
            failures.push(format!("block {n} ({intro}): {e}"));
        }
    }
    assert!(failures.is_empty(), "the README's outputs drifted:\n{}", failures.join("\n\n"));
    assert!(compared >= 9, "{compared} outputs compared");
}

#[test]
fn masking_keeps_what_matters() {
    let shown =
        r#"{"run_id":"01M82EFA61SA47S6546MJGZGF7","created_at":"2026-11-22T20:17:00.608381Z","last_seq":0}"#;
    let same =
        r#"{"run_id":"01M88AAAAAAAAAAAAAAAAAAAAA","created_at":"2026-11-24T23:20:01.1Z","last_seq":0}"#;
    assert_eq!(matches(shown, same), Ok(()));
    assert!(matches(shown, &same.replace("\"last_seq\":0", "\"last_seq\":1")).is_err());
    assert!(matches("new key b98aca7b2704 for tenant", "new key 0123456789ab for tenant").is_ok());
    assert!(matches("a ... c", "a b c").is_ok());
    assert!(matches("a ... c", "c b a").is_err());
}

#[tokio::test]
async fn the_administration_example_runs_as_shown() {
    let t = TestApp::new().await;
    let example = blocks("Administration")
        .into_iter()
        .find(|b| b.text.starts_with("$ agent-stream tenant create"))
        .expect("the example");
    let mut last_key_id = String::new();
    let mut steps = vec![];
    for line in example.text.lines() {
        match line.strip_prefix("$ ") {
            Some(cmd) => steps.push((cmd.to_owned(), String::new())),
            None => {
                let (_, shown) = steps.last_mut().expect("a command first");
                shown.push_str(line);
                shown.push('\n');
            }
        }
    }
    assert!(steps.len() >= 4);
    for (cmd, shown) in steps {
        let mut args: Vec<String> = cmd.split_whitespace().skip(1).map(str::to_owned).collect();
        // A key id the example made earlier is this run's.
        for a in &mut args {
            if a.len() == 12 && a.chars().all(|c| c.is_ascii_hexdigit()) {
                *a = last_key_id.clone();
            }
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-stream"))
            .args(&args)
            .env("DATABASE_URL", &t.db.url)
            .env("AGENT_STREAM_SCHEMA", &t.db.schema)
            .env("RUST_LOG", "warn")
            .output()
            .expect("agent-stream runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
        if let Some(id) = stdout.lines().find_map(|l| l.strip_prefix("new key ")) {
            last_key_id = id.split_whitespace().next().unwrap_or_default().to_owned();
        }
        if let Err(e) = matches(&shown, &stdout) {
            panic!("`{cmd}`: the README's output drifted: {e}");
        }
    }
}
