/// Splits source text into words and numbers.
pub struct Tokenizer<'a> {
    input: &'a str,
    pos: usize,
}

#[derive(Debug, PartialEq)]
pub enum Token {
    Word(String),
    Number(i64),
}

impl<'a> Tokenizer<'a> {
    pub fn new(input: &'a str) -> Self {
        Tokenizer { input, pos: 0 }
    }

    /// The next word or number, skipping whitespace and punctuation.
    pub fn next_token(&mut self) -> Option<Token> {
        let rest = &self.input[self.pos..];
        let start = rest.find(|c: char| c.is_alphanumeric())?;
        let tail = &rest[start..];
        let len = tail.find(|c: char| !c.is_alphanumeric()).unwrap_or(tail.len());
        self.pos += start + len;
        let text = &tail[..len];
        Some(match text.parse::<i64>() {
            Ok(n) => Token::Number(n),
            Err(_) => Token::Word(text.to_string()),
        })
    }
}
