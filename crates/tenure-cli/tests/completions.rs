//! `tenure completions` and `tenure man`: generated from the same clap definitions as
//! the parser, so they cannot drift from it. The bash script is loaded in a real bash
//! and asked to complete; the page is rendered by `man -l`.

mod common;

use std::process::{Command, Stdio};

fn output_of(args: &[&str]) -> String {
    let output = common::tenure().args(args).output().expect("run tenure");
    assert!(output.status.success(), "tenure {args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("utf-8")
}

/// Completes `words` (the last one being completed) with the bash script.
fn bash_complete(script: &std::path::Path, words: &[&str]) -> Vec<String> {
    let program = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; \
         _tenure tenure '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" "),
        words.len() - 1,
        words.join(" "),
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let output = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    assert!(output.status.success(), "bash: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_bash_completion_loads_and_completes_subcommands_and_flags() {
    let dir = common::tempdir();
    let script = dir.path().join("tenure.bash");
    std::fs::write(&script, output_of(&["completions", "bash"])).unwrap();
    let subcommands = bash_complete(&script, &["tenure", "st"]);
    assert_eq!(subcommands, ["status"], "completing `tenure st`");
    let all = bash_complete(&script, &["tenure", ""]);
    for expected in [
        "run",
        "status",
        "members",
        "fence",
        "demo",
        "completions",
        "man",
    ] {
        assert!(all.iter().any(|w| w == expected), "{expected} in {all:?}");
    }
    let flags = bash_complete(&script, &["tenure", "run", "--ro"]);
    assert_eq!(flags, ["--role"], "completing `tenure run --ro`");
}

#[test]
fn zsh_and_fish_scripts_name_every_subcommand() {
    for shell in ["zsh", "fish"] {
        let script = output_of(&["completions", shell]);
        for subcommand in ["run", "status", "members", "fence", "demo"] {
            assert!(script.contains(subcommand), "{shell}: {subcommand}");
        }
    }
    let refused = common::tenure()
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("tcsh"));
}

/// The text without the overstrike (`X\bX` bold, `_\bX` underline) man uses off a
/// terminal.
fn plain(rendered: &str) -> String {
    let mut out: Vec<char> = Vec::new();
    for c in rendered.chars() {
        if c == '\u{8}' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out.into_iter().collect()
}

#[test]
fn the_man_page_renders() {
    let dir = common::tempdir();
    let page = dir.path().join("tenure.1");
    std::fs::write(&page, output_of(&["man"])).unwrap();
    let output = Command::new("man")
        .arg("-l")
        .arg(&page)
        .env("MANWIDTH", "80")
        .env("MAN_KEEP_FORMATTING", "0")
        .env("PAGER", "cat")
        .stdin(Stdio::null())
        .output()
        .expect("man (Debian package man-db)");
    assert!(output.status.success(), "man -l: {output:?}");
    let text = plain(&String::from_utf8_lossy(&output.stdout));
    for section in ["NAME", "SYNOPSIS", "SUBCOMMANDS"] {
        assert!(text.contains(section), "{section} in:\n{text}");
    }
    assert!(text.contains("tenure-run"), "{text}");
    assert!(
        !text.contains("chaos-worker"),
        "hidden subcommands stay hidden:\n{text}"
    );
}
