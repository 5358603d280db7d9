//! Lists with a fixed maximum length, such as the [`MAX_TRANSITIONS`] timed
//! transitions of a record: pushing onto a full list drops the oldest;
//! parsing a longer list is refused.

use serde::{Deserialize, Deserializer, Serialize};

use crate::limits::MAX_TRANSITIONS;

/// Timed transitions of a status or journal record.
pub type Transitions<T> = Bounded<T, MAX_TRANSITIONS>;

/// A list bounded at `N` entries at parse; pushing onto a full list drops the oldest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Bounded<T, const N: usize>(Vec<T>);

impl<T, const N: usize> Default for Bounded<T, N> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T, const N: usize> Bounded<T, N> {
    pub fn push(&mut self, t: T) {
        if self.0.len() == N {
            self.0.remove(0);
        }
        self.0.push(t);
    }
    pub fn as_slice(&self) -> &[T] {
        &self.0
    }
    pub fn last(&self) -> Option<&T> {
        self.0.last()
    }
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Keeps only the entries for which `keep` is true.
    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.0.retain(keep);
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<T>::deserialize(d)?;
        if v.len() > N {
            return Err(serde::de::Error::custom(format!(
                "{} entries, more than the limit of {N}",
                v.len()
            )));
        }
        Ok(Self(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_drops_oldest_and_parse_refuses_more() {
        let mut t = Transitions::default();
        for i in 0..20u32 {
            t.push(i);
        }
        assert_eq!(t.len(), MAX_TRANSITIONS);
        assert_eq!(t.as_slice().first(), Some(&4));
        let json = serde_json::to_string(&(0..17).collect::<Vec<u32>>()).expect("json");
        let err = serde_json::from_str::<Transitions<u32>>(&json)
            .expect_err("17 transitions must be refused");
        assert!(err
            .to_string()
            .contains("17 entries, more than the limit of 16"));
        let mut b: Bounded<u8, 2> = Bounded::default();
        b.push(1);
        b.push(2);
        b.push(3);
        assert_eq!(b.as_slice(), &[2, 3]);
        assert!(serde_json::from_str::<Bounded<u8, 2>>("[1,2,3]").is_err());
    }
}
