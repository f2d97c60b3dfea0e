// Declarations of the part of NIXL's C++ API (libnixl.so of the PyPI wheel nixl-cu13 1.5.1)
// that nixl_native.cpp calls, written for nixl-rs from the library's exported ABI.
//
// These are not NIXL's headers (those are not shipped in the wheel, and the public source of
// 1.5.1 is not vendored here): each declaration below matches a symbol the wheel exports, which
// the linker checks by its mangled name (parameter types and constness); the layouts of the
// structs the program builds itself were checked against the library's machine code:
//   nixlAgentConfig         40 bytes, copied as such by nixlAgentData's constructor
//   nixlAgentOptionalArgs   `notif` engaged flag at byte 56, `hasNotif` at 96 (postXferReq)
//   nixlDescList<T>         vtable order: ~, ~, resize, addDesc, getIndex (libnixl_build.so)
// build.sh repeats the symbol check before every build (nm on the wheel's libraries).
#ifndef NIXL_RS_NIXL_ABI_H
#define NIXL_RS_NIXL_ABI_H

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

class nixlSerDes;
class nixlDlistH;
class nixlBackendH;
class nixlXferReqH;
class nixlAgentData;

enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };
enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };
enum nixl_status_t : int {
    NIXL_IN_PROG = 1,
    NIXL_SUCCESS = 0,
    NIXL_ERR_NOT_POSTED = -1,
    NIXL_ERR_INVALID_PARAM = -2,
    NIXL_ERR_BACKEND = -3,
    NIXL_ERR_NOT_FOUND = -4,
    // ... down to -12; every negative value is an error.
};
enum class nixl_thread_sync_t { NONE, STRICT, RW };

using nixl_blob_t = std::string;
using nixl_backend_t = std::string;
using nixl_b_params_t = std::unordered_map<std::string, std::string>;
using nixl_mem_list_t = std::vector<nixl_mem_t>;
using nixl_notifs_t = std::unordered_map<std::string, std::vector<nixl_blob_t>>;

struct nixlAgentConfig {
    bool useProgThread = false;
    bool useListenThread = false;
    uint16_t listenPort = 8888;
    nixl_thread_sync_t syncMode = nixl_thread_sync_t::NONE;
    bool captureTelemetry = false;
    uint64_t pthrDelay = 0;
    uint64_t lthrDelay = 100000;
    std::chrono::microseconds etcdWatchTimeout{5000000};
};
static_assert(sizeof(nixlAgentConfig) == 40, "nixlAgentConfig layout");

struct nixlAgentOptionalArgs {
    std::vector<nixlBackendH *> backends;
    std::optional<nixl_blob_t> notif;
    nixl_blob_t notifMsg;
    bool hasNotif = false;
    bool skipDescMerge = false;
    bool includeConnInfo = false;
    std::string ipAddr;
    int port = 8888;
    std::string metadataLabel;
    nixl_blob_t customParam;
};
static_assert(offsetof(nixlAgentOptionalArgs, notif) == 24, "optional args layout");
static_assert(offsetof(nixlAgentOptionalArgs, hasNotif) == 96, "optional args layout");
using nixl_opt_args_t = nixlAgentOptionalArgs;

class nixlBasicDesc {
public:
    uintptr_t addr = 0;
    size_t len = 0;
    uint64_t devId = 0;
    nixlBasicDesc(const uintptr_t &addr, const size_t &len, const uint64_t &dev_id);
};
static_assert(sizeof(nixlBasicDesc) == 24, "nixlBasicDesc layout");

class nixlBlobDesc : public nixlBasicDesc {
public:
    nixl_blob_t metaInfo;
    nixlBlobDesc(const uintptr_t &addr,
                 const size_t &len,
                 const uint64_t &dev_id,
                 const nixl_blob_t &meta_info);
};

// Instantiated (with its vtable) inside libnixl_build.so; only declared here.
template<class T> class nixlDescList {
protected:
    nixl_mem_t type;
    std::vector<T> descs;

public:
    nixlDescList(const nixl_mem_t &type, const int &init_size);
    nixlDescList(const nixlDescList &) = delete;
    nixlDescList &operator=(const nixlDescList &) = delete;
    virtual ~nixlDescList();
    virtual void resize(const size_t &count);
    virtual void addDesc(const T &desc);
    virtual int getIndex(const nixlBasicDesc &query) const;
};
extern template class nixlDescList<nixlBasicDesc>;
extern template class nixlDescList<nixlBlobDesc>;
using nixl_xfer_dlist_t = nixlDescList<nixlBasicDesc>;
using nixl_reg_dlist_t = nixlDescList<nixlBlobDesc>;

class nixlAgent {
    std::unique_ptr<nixlAgentData> data;

public:
    nixlAgent(const std::string &name, const nixlAgentConfig &cfg);
    ~nixlAgent();
    nixl_status_t getPluginParams(const nixl_backend_t &type,
                                  nixl_mem_list_t &mems,
                                  nixl_b_params_t &params) const;
    nixl_status_t
    createBackend(const nixl_backend_t &type, const nixl_b_params_t &params, nixlBackendH *&h);
    nixl_status_t registerMem(const nixl_reg_dlist_t &descs, const nixl_opt_args_t *extra);
    nixl_status_t deregisterMem(const nixl_reg_dlist_t &descs, const nixl_opt_args_t *extra);
    nixl_status_t getLocalMD(nixl_blob_t &str) const;
    nixl_status_t loadRemoteMD(const nixl_blob_t &remote_metadata, std::string &agent_name);
    nixl_status_t prepXferDlist(const std::string &agent_name,
                                const nixl_xfer_dlist_t &descs,
                                nixlDlistH *&dlist_hndl,
                                const nixl_opt_args_t *extra) const;
    nixl_status_t makeXferReq(const nixl_xfer_op_t &operation,
                              const nixlDlistH *local_side,
                              const std::vector<int> &local_indices,
                              const nixlDlistH *remote_side,
                              const std::vector<int> &remote_indices,
                              nixlXferReqH *&req_hndl,
                              const nixl_opt_args_t *extra) const;
    nixl_status_t postXferReq(nixlXferReqH *req_hndl, const nixl_opt_args_t *extra) const;
    nixl_status_t getXferStatus(nixlXferReqH *req_hndl) const;
    nixl_status_t releaseXferReq(nixlXferReqH *req_hndl) const;
    nixl_status_t releasedDlistH(nixlDlistH *dlist_hndl) const;
    nixl_status_t getNotifs(nixl_notifs_t &notif_map, const nixl_opt_args_t *extra);
    nixl_status_t
    genNotif(const std::string &remote_agent, const nixl_blob_t &msg, const nixl_opt_args_t *extra)
        const;
};

#endif
