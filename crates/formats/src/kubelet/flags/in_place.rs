//! The in-place edit of a flags variable: the words of its decoded value spliced one by
//! one ([`crate::textedit`]), so every byte the edit does not change stays.

use std::ops::Range;

use super::{WHITESPACE, flag_name_of, last_assignment, scan};
use crate::textedit::{InPlace, systemd_encode};

/// The last assignment of a variable in an env file, edited in place ([`InPlace`]):
/// inserted text is written in the quoting of the character before it
/// ([`systemd_encode`]), every other byte stays.
pub(super) struct FlagsInPlace {
    pub text: String,
    pub var: String,
}

impl FlagsInPlace {
    /// The decoded value and the byte ranges of its words.
    fn words(&self) -> (String, Vec<Range<usize>>) {
        let d = self.decoded();
        let mut spans = Vec::new();
        let mut start = None;
        for (i, c) in d.char_indices() {
            match (WHITESPACE.contains(&c), start) {
                (true, Some(s)) => {
                    spans.push(s..i);
                    start = None;
                }
                (false, None) => start = Some(i),
                _ => {}
            }
        }
        if let Some(s) = start {
            spans.push(s..d.len());
        }
        (d, spans)
    }

    /// Removes word `i` with the whitespace before it (after it when it is the first).
    fn remove_word(&mut self, i: usize) {
        let (_, w) = self.words();
        let range = if i > 0 {
            w[i - 1].end..w[i].end
        } else if w.len() > 1 {
            w[0].start..w[1].start
        } else {
            w[0].clone()
        };
        let Ok(()) = self.splice(range, "");
    }

    /// Inserts `word` so that it becomes word `at`: after the word before it (one space
    /// first), or before the first word (one space after).
    fn insert_word(&mut self, at: usize, word: &str) {
        let (d, w) = self.words();
        let (pos, text) = if at > 0 {
            (w[at - 1].end, format!(" {word}"))
        } else if let Some(first) = w.first() {
            (first.start, format!("{word} "))
        } else {
            (d.len(), word.to_string())
        };
        let Ok(()) = self.splice(pos..pos, &text);
    }
}

impl InPlace for FlagsInPlace {
    type Error = std::convert::Infallible;
    fn decoded(&self) -> String {
        last_assignment(&scan(&self.text), &self.var)
            .map(|a| a.value.text().to_owned())
            .unwrap_or_default()
    }
    fn splice(&mut self, range: Range<usize>, insert: &str) -> Result<(), Self::Error> {
        if let Some(a) = last_assignment(&scan(&self.text), &self.var) {
            self.text = a.value.splice(&self.text, range, insert, systemd_encode);
        }
        Ok(())
    }
}

/// Length in bytes of the longest common prefix of `a` and `b` (on char boundaries).
fn common_prefix(a: &str, b: &str) -> usize {
    a.chars()
        .zip(b.chars())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len_utf8())
        .sum()
}

/// The edit of [`edit_words`], done word by word on the file in place: a removed flag
/// goes with the whitespace next to it, a set flag replaces the bytes of its first
/// occurrence, a new one is inserted after the word before its place.
pub(super) fn edit_in_place(v: &mut FlagsInPlace, set: &[(String, String)], remove: &[String]) {
    let names = |v: &FlagsInPlace| -> Vec<String> {
        let (d, w) = v.words();
        w.iter()
            .map(|r| flag_name_of(&d[r.clone()]).to_string())
            .collect()
    };
    for r in remove {
        while let Some(i) = names(v).iter().position(|n| n == r) {
            v.remove_word(i);
        }
    }
    for (n, val) in set {
        let new_word = format!("--{n}={val}");
        let now = names(v);
        if let Some(first) = now.iter().position(|x| x == n) {
            let (d, w) = v.words();
            let old = &d[w[first].clone()];
            if old != new_word {
                // only the characters that differ: the rest keeps its bytes and quoting
                let pre = common_prefix(old, &new_word);
                let suf = common_prefix(
                    &old[pre..].chars().rev().collect::<String>(),
                    &new_word[pre..].chars().rev().collect::<String>(),
                );
                let range = w[first].start + pre..w[first].end - suf;
                let Ok(()) = v.splice(range, &new_word[pre..new_word.len() - suf]);
            }
            while let Some(later) = names(v).iter().rposition(|x| x == n).filter(|l| *l > first) {
                v.remove_word(later);
            }
        } else {
            let sorted = now.windows(2).all(|p| p[0] <= p[1]);
            let at = if sorted {
                now.iter()
                    .position(|x| x.as_str() > n.as_str())
                    .unwrap_or(now.len())
            } else {
                now.len()
            };
            v.insert_word(at, &new_word);
        }
    }
}
