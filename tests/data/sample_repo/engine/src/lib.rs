//! Fuzzy string matching.

pub mod parser;

/// Edit distance between two strings: insertions, deletions and substitutions.
pub fn levenshtein(a: &str, b: &str) -> usize {
    let b_chars: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b_chars.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b_chars.iter().enumerate() {
            let cost = if ca == *cb { 0 } else { 1 };
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b_chars.len()]
}

/// The candidate closest to `query`.
pub fn best_match<'a>(query: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates.iter().copied().min_by_key(|c| levenshtein(query, c))
}
