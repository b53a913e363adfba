#include "server/http/proto_json.h"

#include <google/protobuf/descriptor.h>

#include <vector>

namespace fastformer::http {

namespace pb = google::protobuf;

namespace {

void scalar_json(const pb::Message& m, const pb::FieldDescriptor* f, int index, json::Writer& w) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      w.number(int64_t(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f)));
      break;
    case pb::FieldDescriptor::CPPTYPE_INT64:
      w.number(int64_t(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f)));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      w.number(int64_t(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f)));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      const uint64_t v = rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
      w.raw(std::to_string(v));
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      w.number(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      w.f32(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      w.boolean(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
      break;
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      w.string((rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name());
      break;
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      const std::string v = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      if (f->type() == pb::FieldDescriptor::TYPE_BYTES) {
        w.base64(v);
      } else {
        w.string(v);
      }
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      proto_json(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f), w);
      break;
  }
}

}  // namespace

void proto_json(const pb::Message& message, json::Writer& w) {
  const pb::Reflection* r = message.GetReflection();
  const pb::Descriptor* d = message.GetDescriptor();
  // Every field, zeros and empty lists included (Triton prints "fail":{"count":0,"ns":0}), but
  // not a message or oneof member that is not set.
  std::vector<const pb::FieldDescriptor*> fields;
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (!f->is_repeated() &&
        (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE ||
         f->containing_oneof() != nullptr) &&
        !r->HasField(message, f)) {
      continue;
    }
    fields.push_back(f);
  }
  w.ch('{');
  for (size_t i = 0; i < fields.size(); ++i) {
    const pb::FieldDescriptor* f = fields[i];
    if (i > 0) w.ch(',');
    w.key(f->name());
    if (f->is_map()) {
      // A map is a repeated message of {key, value}: an object here.
      w.ch('{');
      const int n = r->FieldSize(message, f);
      for (int k = 0; k < n; ++k) {
        const pb::Message& entry = r->GetRepeatedMessage(message, f, k);
        const pb::FieldDescriptor* key = entry.GetDescriptor()->map_key();
        const pb::FieldDescriptor* value = entry.GetDescriptor()->map_value();
        if (k > 0) w.ch(',');
        if (key->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
          w.key(entry.GetReflection()->GetString(entry, key));
        } else {
          json::Writer number;
          scalar_json(entry, key, -1, number);
          w.key(number.str());
        }
        scalar_json(entry, value, -1, w);
      }
      w.ch('}');
    } else if (f->is_repeated()) {
      w.ch('[');
      const int n = r->FieldSize(message, f);
      for (int k = 0; k < n; ++k) {
        if (k > 0) w.ch(',');
        scalar_json(message, f, k, w);
      }
      w.ch(']');
    } else {
      scalar_json(message, f, -1, w);
    }
  }
  w.ch('}');
}

}  // namespace fastformer::http
