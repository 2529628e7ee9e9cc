//! String helpers shared by the modules that cut text to a kernel or API limit.

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
#[must_use]
pub fn cut_at_char(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(cut_at_char("abc", 5), "abc");
        assert_eq!(cut_at_char("abc", 2), "ab");
        assert_eq!(cut_at_char("", 0), "");
        // "é" is 2 bytes: a cut inside it drops it.
        assert_eq!(cut_at_char("ab\u{e9}", 3), "ab");
        assert_eq!(cut_at_char("ab\u{e9}", 4), "ab\u{e9}");
    }
}
