// The push codecs pslab knows: cluster.codec -> codec. Adding one: its file beside these (a
// wire id of its own), a line here, its tests (tests/test_codecs.cpp) and a README line.
#include "ps/codecs/codec.h"

namespace pslab {

std::unique_ptr<PushCodec> make_f32(const std::string&);

Registry<PushCodec>& codec_registry() {
  static Registry<PushCodec> r("push codec", {
      {"f32", "f32", "dense float32, sent and applied in place", false, make_f32},
  });
  return r;
}

}  // namespace pslab
