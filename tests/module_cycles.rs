//! Dependency cycles between the crate's top-level modules (`src/<module>.rs` or
//! `src/<module>/`): an edge A → B is any `crate::B` path in A's code outside comments and
//! `#[cfg(test)]` modules. The strongly connected components of that graph are the cycles.
//!
//! The crate has none, and this test fails when an edge closes one, naming the edges inside it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The source of `text` without comments and `#[cfg(test)]` modules (from the attribute to the
/// end of the file: test modules sit last in this crate's files).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Top-level modules each top-level module names through `crate::`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods: BTreeSet<String> = std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .map(|n| n.trim_end_matches(".rs").to_string())
        .filter(|n| n != "lib" && n != "main")
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let top = top.trim_end_matches(".rs").to_string();
            if !mods.contains(&top) {
                continue;
            }
            let c = code(&std::fs::read_to_string(&p).unwrap());
            let mut names = |s: &str| {
                let n: String = s
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if n != top && mods.contains(&n) {
                    g.entry(top.clone()).or_default().insert(n);
                }
            };
            for (i, _) in c.match_indices("crate::") {
                let rest = &c[i + "crate::".len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    let end = group.find('}').unwrap_or(group.len());
                    for item in group[..end].split(',') {
                        names(item.trim());
                    }
                } else {
                    names(rest);
                }
            }
        }
    }
    g
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.g.get(v) {
            for w in ws {
                if !t.index.contains_key(w.as_str()) {
                    visit(t, w);
                    let lw = t.low[w.as_str()];
                    let lv = t.low[v].min(lw);
                    t.low.insert(v, lv);
                } else if t.on.contains(w.as_str()) {
                    let lv = t.low[v].min(t.index[w.as_str()]);
                    t.low.insert(v, lv);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut c = BTreeSet::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                c.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                t.out.push(c);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_module_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    let mut found = Vec::new();
    for c in cycles(&g) {
        let mut edges = Vec::new();
        for a in &c {
            for b in g.get(a).into_iter().flatten().filter(|b| c.contains(*b)) {
                edges.push(format!("{a}>{b}"));
            }
        }
        found.push(edges);
    }
    assert!(
        found.is_empty(),
        "module cycles (A>B: A names crate::B), each with the edges inside it: {found:?}"
    );
}

/// The scanner sees the kinds of path this crate uses, and the component finder finds a cycle.
#[test]
fn the_scanner_and_the_cycle_finder_work() {
    let c = code(
        "use crate::a::b; // crate::z\nfn f() { crate::{c, d::e}; }\n#[cfg(test)]\nuse crate::t;",
    );
    assert!(c.contains("crate::a") && c.contains("crate::{c, d::e}"));
    assert!(!c.contains("crate::z") && !c.contains("crate::t"));
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .into_iter()
        .fold(BTreeMap::new(), |mut g, (x, y)| {
            g.entry(x.to_string()).or_default().insert(y.to_string());
            g
        });
    let cs = cycles(&g);
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].len(), 3);
}
