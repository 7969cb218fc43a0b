//! The Merkle tree hash of RFC 6962 (Certificate Transparency), over
//! SHA-256:
//!
//! - leaf hash: `SHA-256(0x00 || data)`;
//! - node hash: `SHA-256(0x01 || left || right)`;
//! - for n > 1 leaves the tree splits at k, the largest power of two below n:
//!   `MTH(D[0..n]) = node(MTH(D[0..k]), MTH(D[k..n]))`;
//! - one leaf: its leaf hash; no leaves: `SHA-256("")`.
//!
//! The prefixes keep a leaf from ever being mistaken for an inner node (no
//! second-preimage trick), and the split rule makes the root of n leaves
//! unique without padding.

use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    h.finalize().into()
}

pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root over the leaves' data, in order.
pub fn root<D: AsRef<[u8]>>(leaves: &[D]) -> Hash {
    if leaves.is_empty() {
        return Sha256::digest([]).into();
    }
    let hashes: Vec<Hash> = leaves.iter().map(|d| leaf_hash(d.as_ref())).collect();
    subtree(&hashes)
}

fn subtree(hashes: &[Hash]) -> Hash {
    match hashes {
        [only] => *only,
        _ => {
            let mut k = 1;
            while k * 2 < hashes.len() {
                k *= 2;
            }
            node_hash(&subtree(&hashes[..k]), &subtree(&hashes[k..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::hex;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The test vectors of Certificate Transparency's reference
    /// implementation (merkle_tree_test.cc): roots of the first n inputs.
    #[test]
    fn rfc6962_test_vectors() {
        let inputs = [
            "",
            "00",
            "10",
            "2021",
            "3031",
            "40414243",
            "5051525354555657",
            "606162636465666768696a6b6c6d6e6f",
        ]
        .map(unhex);
        let roots = [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
            "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
            "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
            "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
            "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
        ];
        for (n, expected) in roots.iter().enumerate() {
            assert_eq!(hex(&root(&inputs[..=n])), *expected, "root of {} leaves", n + 1);
        }
    }

    #[test]
    fn empty_tree_is_the_hash_of_nothing() {
        assert_eq!(
            hex(&root::<&[u8]>(&[])),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn any_change_or_reorder_changes_the_root() {
        let leaves = [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()];
        let base = root(&leaves);
        assert_ne!(root(&[b"a".to_vec(), b"c".to_vec(), b"b".to_vec()]), base);
        assert_ne!(root(&[b"a".to_vec(), b"b".to_vec(), b"d".to_vec()]), base);
        assert_ne!(root(&leaves[..2]), base);
        // A leaf is not confusable with the node above two leaves.
        let inner = node_hash(&leaf_hash(b"a"), &leaf_hash(b"b"));
        assert_ne!(root(&[inner.to_vec()]), root(&leaves[..2]));
    }
}
