//! Kubernetes resource quantities (`100m`, `1.5`, `64Mi`, `1e3`, `2G`): parsed exactly enough for
//! CPU in millicores and memory or storage in bytes, rounding up as the API server does.

/// A quantity as a rational number of base units, `num / den`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantity {
    num: u128,
    den: u128,
}

impl Quantity {
    /// Whole base units (bytes), rounded up.
    pub fn value(&self) -> u64 {
        self.num.div_ceil(self.den).min(u64::MAX as u128) as u64
    }

    /// Thousandths of the base unit (millicores), rounded up.
    pub fn milli(&self) -> u64 {
        (self.num * 1000).div_ceil(self.den).min(u64::MAX as u128) as u64
    }

    pub fn is_zero(&self) -> bool {
        self.num == 0
    }
}

/// A quantity that does not parse, as written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{text:?} is not a valid quantity (like 100m, 1.5, 64Mi or 2G)")]
pub struct QuantityError {
    pub text: String,
}

/// Parses a quantity; negative and malformed ones are errors.
pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
    let bad = || QuantityError {
        text: s.to_string(),
    };
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() || number.starts_with('.') && number.len() == 1 {
        return Err(bad());
    }
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 9
        || whole.len() > 20
    {
        return Err(bad());
    }
    let mut num: u128 = format!("{whole}{frac}").parse().map_err(|_| bad())?;
    let mut den: u128 = 10u128.pow(frac.len() as u32);
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| bad())?;
            if !(-18..=18).contains(&exp) {
                return Err(bad());
            }
            if exp >= 0 {
                (10u128.pow(exp as u32), 1)
            } else {
                (1, 10u128.pow((-exp) as u32))
            }
        }
        _ => return Err(bad()),
    };
    num = num.checked_mul(mul).ok_or_else(bad)?;
    den *= div;
    Ok(Quantity { num, den })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory() {
        assert_eq!(parse("100m").unwrap().milli(), 100);
        assert_eq!(parse("1").unwrap().milli(), 1000);
        assert_eq!(parse("1.5").unwrap().milli(), 1500);
        assert_eq!(parse("0.0005").unwrap().milli(), 1);
        assert_eq!(parse("64Mi").unwrap().value(), 64 << 20);
        assert_eq!(parse("2G").unwrap().value(), 2_000_000_000);
        assert_eq!(parse("1e3").unwrap().value(), 1000);
        assert_eq!(parse("128974848").unwrap().value(), 128_974_848);
        assert_eq!(parse("1.5Gi").unwrap().value(), 3 << 29);
        assert!(parse("0").unwrap().is_zero());
        for bad in ["", "-1", "1x", "Mi", "1..2", ".", "1.2.3Mi"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    proptest! {
        /// Huge, odd or hostile quantities are refused or saturate: never an overflow panic.
        #[test]
        fn any_quantity_text_never_panics(s in "[0-9.+eEkKmMgGtTpPi-]{0,60}") {
            if let Ok(q) = super::parse(&s) {
                let _ = (q.value(), q.milli(), q.is_zero());
            }
        }

        /// Plain numbers of bytes read back exactly.
        #[test]
        fn integers_are_exact(n in 0u64..1 << 53) {
            prop_assert_eq!(super::parse(&n.to_string()).unwrap().value(), n);
        }
    }
}
