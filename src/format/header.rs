//! Fixed-size on-disk records: the 88-byte `GlobalHeader`, the 16-byte `TileHeader`, the 16-byte
//! `DirHeader` that opens every layer/vocab region and its 32-byte `DirEntry` records.
//! All little-endian, `#[repr(C, packed)]`, sizes asserted at compile time. They are encoded and
//! decoded field by field (no transmutes), so decoding arbitrary bytes is always safe.

pub const MAGIC: [u8; 8] = *b"CFLOW\0\0\0";
pub const VERSION: u32 = 5;
pub const DIR_MAGIC: [u8; 4] = *b"LDIR";

/// The `.cflow` global header (88 bytes at offset 0).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GlobalHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub feature_flags: u32,
    pub n_layers: u16,
    pub n_heads: u16,
    pub n_kv_heads: u16,
    pub head_dim: u16,
    pub d_model: u32,
    pub d_ff: u32,
    pub vocab: u32,
    pub n_experts: u16,
    pub top_k: u16,
    pub expert_ffn: u32,
    pub max_ctx: u32,
    pub rms_eps: f32,
    pub rope_theta: f32,
    /// Offset of the layer table: (n_layers + 1) × {u64 offset, u64 length}; the last entry is
    /// the vocabulary region.
    pub layer_table_offset: u64,
    pub metadata_offset: u64,
    pub metadata_len: u32,
    pub dense_delay: u8,
    pub expert_delay: u8,
    pub combine_style: u8,
    pub reserved0: u8,
    pub final_logit_softcap: f32,
    pub reserved1: u32,
}
const _: () = assert!(std::mem::size_of::<GlobalHeader>() == 88);

/// Per-tile header (16 bytes), directly before the tile's scales and quants.
/// A tile header's `expert_id` for a matrix outside the routed experts.
pub const DENSE_EXPERT_ID: u8 = 0xFF;

#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileHeader {
    pub layer_id: u16,
    pub matrix_id: u8,
    /// The routed expert's id; [`DENSE_EXPERT_ID`] for every other matrix
    /// ([`TileHeader::expert_byte`]).
    pub expert_id: u8,
    pub row_offset: u32,
    pub col_offset: u16,
    pub tile_rows: u16,
    pub tile_cols: u16,
    /// Quant type id (GGML numbering) of the tile's data.
    pub quant_group: u16,
}
const _: () = assert!(std::mem::size_of::<TileHeader>() == 16);

/// Opens every layer region and the vocab region (16 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirHeader {
    pub magic: [u8; 4],
    /// Layer index, or 0xFFFF for the vocabulary region.
    pub layer: u32,
    pub n_entries: u32,
    pub reserved: u32,
}
const _: () = assert!(std::mem::size_of::<DirHeader>() == 16);

/// One directory record (32 bytes): a matrix, a vector or a table inside a region.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirEntry {
    pub kind: u8,
    pub quant: u8,
    /// Matrices sharing a nonzero group id are stored interleaved by output stripe.
    pub group: u8,
    pub reserved: u8,
    pub rows: u32,
    pub cols: u32,
    pub reserved2: u32,
    /// Absolute file offset of the entry's data (for grouped matrices: the group's region).
    pub offset: u64,
    pub length: u64,
}
const _: () = assert!(std::mem::size_of::<DirEntry>() == 32);

/// What a directory entry holds. Matrix ids in tile headers use the same numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EntryKind {
    Q = 1,
    K = 2,
    V = 3,
    O = 4,
    Gate = 5,
    Up = 6,
    Down = 7,
    ExpertGate = 8,
    ExpertUp = 9,
    ExpertDown = 10,
    AttnNorm = 16,
    FfnNorm = 17,
    MoeNorm = 18,
    QBias = 19,
    KBias = 20,
    VBias = 21,
    /// RMSNorm weight over the whole Q projection output (`q_dim`), applied before RoPE (OLMoE);
    /// with `FLAG_QK_NORM_PER_HEAD` over each head (`head_dim`, Gemma 3).
    QNorm = 22,
    /// RMSNorm weight over the whole K projection output (`kv_dim`), applied before RoPE.
    KNorm = 23,
    Router = 24,
    ExpertTable = 25,
    /// RMSNorm weight on the attention output before the residual add (`FLAG_POST_NORMS`).
    PostAttnNorm = 26,
    /// RMSNorm weight on the FFN output before the residual add (`FLAG_POST_NORMS`).
    PostFfnNorm = 27,
    /// Our extension: the shared expert's sigmoid gate (`d_model` f32, Qwen2-MoE's
    /// `ffn_gate_inp_shexp`): the dense FFN's output is scaled by σ(w · x̂), x̂ its normalized
    /// input. Only in layers with a dense FFN (the shared expert).
    SharedGate = 28,
    /// Our extension (`moefy`): a bias per expert added to the router logits (`n_experts` f32).
    RouterBias = 29,
    Embedding = 32,
    LmHead = 33,
    FinalNorm = 34,
}

impl EntryKind {
    pub fn from_u8(v: u8) -> Option<EntryKind> {
        use EntryKind::*;
        Some(match v {
            1 => Q,
            2 => K,
            3 => V,
            4 => O,
            5 => Gate,
            6 => Up,
            7 => Down,
            8 => ExpertGate,
            9 => ExpertUp,
            10 => ExpertDown,
            16 => AttnNorm,
            17 => FfnNorm,
            18 => MoeNorm,
            19 => QBias,
            20 => KBias,
            21 => VBias,
            22 => QNorm,
            23 => KNorm,
            24 => Router,
            25 => ExpertTable,
            26 => PostAttnNorm,
            27 => PostFfnNorm,
            28 => SharedGate,
            29 => RouterBias,
            32 => Embedding,
            33 => LmHead,
            34 => FinalNorm,
            _ => return None,
        })
    }
    pub fn is_matrix(self) -> bool {
        use EntryKind::*;
        matches!(
            self,
            Q | K
                | V
                | O
                | Gate
                | Up
                | Down
                | ExpertGate
                | ExpertUp
                | ExpertDown
                | Embedding
                | LmHead
        )
    }
    pub fn is_vector(self) -> bool {
        use EntryKind::*;
        matches!(
            self,
            AttnNorm
                | FfnNorm
                | MoeNorm
                | QBias
                | KBias
                | VBias
                | QNorm
                | KNorm
                | PostAttnNorm
                | PostFfnNorm
                | SharedGate
                | RouterBias
                | FinalNorm
        )
    }
}

/// Little-endian cursor over a byte slice; every read is bounds-checked (returns None past end).
pub(crate) struct Rd<'a> {
    pub b: &'a [u8],
    pub p: usize,
}

impl<'a> Rd<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Rd { b, p: 0 }
    }
    pub fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let s = self.b.get(self.p..self.p.checked_add(N)?)?;
        self.p += N;
        s.try_into().ok()
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.bytes::<1>()?[0])
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes()?))
    }
    pub fn f32(&mut self) -> Option<f32> {
        Some(f32::from_le_bytes(self.bytes()?))
    }
}

impl GlobalHeader {
    pub const SIZE: usize = 88;

    pub fn encode(&self) -> [u8; 88] {
        let mut o = Vec::with_capacity(88);
        let h = *self;
        o.extend_from_slice(&h.magic);
        o.extend_from_slice(&{ h.version }.to_le_bytes());
        o.extend_from_slice(&{ h.feature_flags }.to_le_bytes());
        o.extend_from_slice(&{ h.n_layers }.to_le_bytes());
        o.extend_from_slice(&{ h.n_heads }.to_le_bytes());
        o.extend_from_slice(&{ h.n_kv_heads }.to_le_bytes());
        o.extend_from_slice(&{ h.head_dim }.to_le_bytes());
        o.extend_from_slice(&{ h.d_model }.to_le_bytes());
        o.extend_from_slice(&{ h.d_ff }.to_le_bytes());
        o.extend_from_slice(&{ h.vocab }.to_le_bytes());
        o.extend_from_slice(&{ h.n_experts }.to_le_bytes());
        o.extend_from_slice(&{ h.top_k }.to_le_bytes());
        o.extend_from_slice(&{ h.expert_ffn }.to_le_bytes());
        o.extend_from_slice(&{ h.max_ctx }.to_le_bytes());
        o.extend_from_slice(&{ h.rms_eps }.to_le_bytes());
        o.extend_from_slice(&{ h.rope_theta }.to_le_bytes());
        o.extend_from_slice(&{ h.layer_table_offset }.to_le_bytes());
        o.extend_from_slice(&{ h.metadata_offset }.to_le_bytes());
        o.extend_from_slice(&{ h.metadata_len }.to_le_bytes());
        o.extend_from_slice(&[h.dense_delay, h.expert_delay, h.combine_style, h.reserved0]);
        o.extend_from_slice(&{ h.final_logit_softcap }.to_le_bytes());
        o.extend_from_slice(&{ h.reserved1 }.to_le_bytes());
        o.try_into().expect("header is 88 bytes")
    }

    /// Decodes the first 88 bytes (None when shorter).
    pub fn decode(b: &[u8]) -> Option<GlobalHeader> {
        let mut r = Rd::new(b);
        Some(GlobalHeader {
            magic: r.bytes()?,
            version: r.u32()?,
            feature_flags: r.u32()?,
            n_layers: r.u16()?,
            n_heads: r.u16()?,
            n_kv_heads: r.u16()?,
            head_dim: r.u16()?,
            d_model: r.u32()?,
            d_ff: r.u32()?,
            vocab: r.u32()?,
            n_experts: r.u16()?,
            top_k: r.u16()?,
            expert_ffn: r.u32()?,
            max_ctx: r.u32()?,
            rms_eps: r.f32()?,
            rope_theta: r.f32()?,
            layer_table_offset: r.u64()?,
            metadata_offset: r.u64()?,
            metadata_len: r.u32()?,
            dense_delay: r.u8()?,
            expert_delay: r.u8()?,
            combine_style: r.u8()?,
            reserved0: r.u8()?,
            final_logit_softcap: r.f32()?,
            reserved1: r.u32()?,
        })
    }
}

impl TileHeader {
    /// The `expert_id` byte of a matrix of routed expert `expert` (`None`: not an expert).
    pub fn expert_byte(expert: Option<u8>) -> u8 {
        expert.unwrap_or(DENSE_EXPERT_ID)
    }

    pub const SIZE: usize = 16;
    pub fn encode(&self) -> [u8; 16] {
        let h = *self;
        let mut o = [0u8; 16];
        o[0..2].copy_from_slice(&{ h.layer_id }.to_le_bytes());
        o[2] = h.matrix_id;
        o[3] = h.expert_id;
        o[4..8].copy_from_slice(&{ h.row_offset }.to_le_bytes());
        o[8..10].copy_from_slice(&{ h.col_offset }.to_le_bytes());
        o[10..12].copy_from_slice(&{ h.tile_rows }.to_le_bytes());
        o[12..14].copy_from_slice(&{ h.tile_cols }.to_le_bytes());
        o[14..16].copy_from_slice(&{ h.quant_group }.to_le_bytes());
        o
    }
    pub fn decode(b: &[u8]) -> Option<TileHeader> {
        let mut r = Rd::new(b);
        Some(TileHeader {
            layer_id: r.u16()?,
            matrix_id: r.u8()?,
            expert_id: r.u8()?,
            row_offset: r.u32()?,
            col_offset: r.u16()?,
            tile_rows: r.u16()?,
            tile_cols: r.u16()?,
            quant_group: r.u16()?,
        })
    }
}

impl DirHeader {
    pub const SIZE: usize = 16;
    pub fn encode(&self) -> [u8; 16] {
        let h = *self;
        let mut o = [0u8; 16];
        o[0..4].copy_from_slice(&h.magic);
        o[4..8].copy_from_slice(&{ h.layer }.to_le_bytes());
        o[8..12].copy_from_slice(&{ h.n_entries }.to_le_bytes());
        o[12..16].copy_from_slice(&{ h.reserved }.to_le_bytes());
        o
    }
    pub fn decode(b: &[u8]) -> Option<DirHeader> {
        let mut r = Rd::new(b);
        Some(DirHeader {
            magic: r.bytes()?,
            layer: r.u32()?,
            n_entries: r.u32()?,
            reserved: r.u32()?,
        })
    }
}

impl DirEntry {
    pub const SIZE: usize = 32;
    pub fn encode(&self) -> [u8; 32] {
        let e = *self;
        let mut o = [0u8; 32];
        o[0] = e.kind;
        o[1] = e.quant;
        o[2] = e.group;
        o[3] = e.reserved;
        o[4..8].copy_from_slice(&{ e.rows }.to_le_bytes());
        o[8..12].copy_from_slice(&{ e.cols }.to_le_bytes());
        o[12..16].copy_from_slice(&{ e.reserved2 }.to_le_bytes());
        o[16..24].copy_from_slice(&{ e.offset }.to_le_bytes());
        o[24..32].copy_from_slice(&{ e.length }.to_le_bytes());
        o
    }
    pub fn decode(b: &[u8]) -> Option<DirEntry> {
        let mut r = Rd::new(b);
        Some(DirEntry {
            kind: r.u8()?,
            quant: r.u8()?,
            group: r.u8()?,
            reserved: r.u8()?,
            rows: r.u32()?,
            cols: r.u32()?,
            reserved2: r.u32()?,
            offset: r.u64()?,
            length: r.u64()?,
        })
    }
}

/// Bytes of one tile (header + scales + quants) of `rows × cols` weights of type `q`.
pub fn tile_bytes(q: crate::quant::QuantType, rows: usize, cols: usize) -> usize {
    TileHeader::SIZE + q.matrix_bytes(rows, cols)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantType;

    #[test]
    fn full_q4_0_tile_is_18448_bytes() {
        assert_eq!(tile_bytes(QuantType::Q4_0, 128, 256), 18_448);
    }

    #[test]
    fn records_roundtrip() {
        let h = GlobalHeader {
            magic: MAGIC,
            version: VERSION,
            n_layers: 6,
            d_model: 512,
            rms_eps: 1e-5,
            final_logit_softcap: 30.0,
            layer_table_offset: 1234,
            ..Default::default()
        };
        assert_eq!(GlobalHeader::decode(&h.encode()), Some(h));
        let t = TileHeader {
            layer_id: 3,
            matrix_id: 5,
            expert_id: 0xFF,
            row_offset: 256,
            col_offset: 512,
            tile_rows: 128,
            tile_cols: 64,
            quant_group: 2,
        };
        assert_eq!(TileHeader::decode(&t.encode()), Some(t));
        let e = DirEntry {
            kind: 1,
            quant: 3,
            group: 1,
            rows: 576,
            cols: 576,
            offset: 99,
            length: 1000,
            ..Default::default()
        };
        assert_eq!(DirEntry::decode(&e.encode()), Some(e));
        assert_eq!(GlobalHeader::decode(&[0u8; 87]), None);
    }
}
